"""hf_demo.py: numalign on Hugging Face models, as an ML engineer would use it on a port.

A Llama built from a small config is run three times by numalign's capture (float64 truth,
bf16 reference, bf16 test), with keyword inputs, an attention mask and HF's defaults. The test
carries one planted bug at a time; for each, the judgement's first divergence names the
module, and isolation ranks it first. A BERT with no bug is aligned. With an output folder,
each judgement's HTML report is written there.

    python examples/hf/hf_demo.py [OUT_DIR]

Exits 0 when every planted bug is found where it was planted (and nothing is found where
nothing was planted), 1 otherwise."""
import copy
import os
import sys

import torch

import numalign
from numalign.capture import isolate, trace_model

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from hf_models import (bert, inputs, llama, plant_backward_bug, plant_forward_bug,  # noqa: E402
                       plant_weight_gradient_bug)

# (what was planted, where, how, which pass shows it)
BUGS = [
    ("forward: a norm's output off by 2%", "model.layers.1.post_attention_layernorm",
     plant_forward_bug, "forward"),
    ("backward only: attention's own code scales a gradient", "model.layers.1.self_attn",
     plant_backward_bug, "backward"),
    ("weight gradient only: down_proj's weight gradient drops a token",
     "model.layers.0.mlp.down_proj", plant_weight_gradient_bug, "backward"),
]


def judge_runs(test_model, ref_model, x):
    truth = trace_model(ref_model, x, torch.float64, truth_of=torch.bfloat16)
    ref = trace_model(ref_model, x, torch.bfloat16)
    test = trace_model(test_model, x, torch.bfloat16)
    return numalign.judge(test, ref, truth)


def main(out_dir=None) -> int:
    found_all = True
    x = inputs()
    reference = llama()
    for what, path, plant, direction in BUGS:
        buggy = copy.deepcopy(reference)
        plant(buggy.get_submodule(path))
        report = judge_runs(buggy, reference, x)
        point = report.first_divergence[direction]
        ranked = isolate(buggy, reference, x, torch.bfloat16).ranking
        found = (not report.aligned and point is not None and point["module"] == path
                 and point["inputs_aligned"] is True and ranked[0]["module"] == path)
        found_all &= found
        print(f"== planted in {path}: {what}")
        print(str(report).split("verdict")[0].strip().split("\n\n")[-1])
        print(f"isolation, worst module: {ranked[0]['module']}"
              f" (ratio {ranked[0]['ratio']:.3g} / limit {ranked[0]['limit']:.3g})")
        print("found where planted" if found else "NOT FOUND where planted")
        print()
        if out_dir:
            with open(os.path.join(out_dir, f"{path}.html"), "w") as f:
                f.write(report.to_html())
    model = bert()
    clean = judge_runs(model, model, x)
    n = clean.summary["tensors"]
    print(f"== BERT, nothing planted: {'aligned' if clean.aligned else 'NOT ALIGNED'} ({n} tensors)")
    found_all &= clean.aligned
    return 0 if found_all else 1


if __name__ == "__main__":
    out = sys.argv[1] if len(sys.argv) > 1 else None
    if out:
        os.makedirs(out, exist_ok=True)
    sys.exit(main(out))
