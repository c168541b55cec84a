"""run.py: captures the transformer three times (float64 truth, bf16 reference, bf16 test
with the planted bug) module by module, and judges them. With --out DIR the traces are
streamed to DIR/{truth,ref,test}.safetensors, for `numalign judge` to read them."""
from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from model import make_input, make_models  # noqa: E402

import numalign  # noqa: E402
from numalign.capture import trace_model  # noqa: E402


def capture(out_dir=None):
    reference, test = make_models()
    x = make_input()
    runs = {}
    for role, model, dtype in (("truth", reference, torch.float64), ("ref", reference, torch.bfloat16),
                               ("test", test, torch.bfloat16)):
        path = os.path.join(out_dir, f"{role}.safetensors") if out_dir else None
        runs[role] = trace_model(model, (x,), dtype, save_to=path, truth_of=torch.bfloat16)
    return runs


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--out", help="stream the traces to this directory")
    args = p.parse_args()
    if args.out:
        os.makedirs(args.out, exist_ok=True)
    runs = capture(args.out)
    report = numalign.judge(runs["test"], runs["ref"], runs["truth"])
    print(report)
    return report.exit_code


if __name__ == "__main__":
    sys.exit(main())
