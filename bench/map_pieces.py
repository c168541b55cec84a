"""map_pieces.py: what judging through a map costs. The same q, k and v tensors are judged
(a) stored apart, paired by name; (b) as pieces of one fused tensor along its last dim, read
through a strided layout (each chunk gathered into a buffer of its thread); (c) pieces along
dim 0, which lie in one run and are read in place; (d) each stored transposed, read through
swapped strides (one element at a time). `numalign judge` runs as a process, the variants
alternating, warm page cache; the median of the runs and its ratio to (a).

    python bench/map_pieces.py --numalign build/numalign [--rows 8192 --width 2048 --repeat 5]
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import torch
from safetensors.torch import save_file


def write(dir_: Path, rows: int, width: int) -> dict:
    g = torch.Generator().manual_seed(0)
    truth = {p: torch.randn(rows, width, dtype=torch.float64, generator=g) for p in "qkv"}
    ref = {p: t.float() for p, t in truth.items()}
    # a legitimate fp32 kernel: within a rounding or so of the truth (aligned under every rule)
    test = {p: (t * (1 + 2.0 ** -27 * torch.randn(t.shape, dtype=torch.float64, generator=g))).float()
            for p, t in truth.items()}
    save_file({f"{p}.out": t for p, t in truth.items()}, dir_ / "truth.safetensors")
    save_file({f"{p}.out": t for p, t in ref.items()}, dir_ / "ref.safetensors")
    save_file({f"{p}.out": t for p, t in test.items()}, dir_ / "apart.safetensors")
    save_file({"qkv.out": torch.cat([test[p] for p in "qkv"], dim=1)}, dir_ / "fused_last.safetensors")
    save_file({"qkv.out": torch.cat([test[p] for p in "qkv"], dim=0)}, dir_ / "fused_first.safetensors")
    save_file({f"{p}.t": test[p].T.contiguous() for p in "qkv"}, dir_ / "transposed.safetensors")
    pieces = ["q.out", "k.out", "v.out"]
    maps = {
        "fused_last": {"map": [{"test": "qkv.out", "ref": pieces, "cat_dim": -1}]},
        "fused_first": {"map": [{"test": "qkv.out", "ref": pieces, "cat_dim": 0}]},
        "transposed": {"map": [{"test": "*.t", "ref": "{1}.out", "transpose": [0, 1]}]},
    }
    for name, m in maps.items():
        (dir_ / f"{name}.json").write_text(json.dumps(m))
    return maps


def judge_seconds(exe: str, dir_: Path, variant: str) -> float:
    args = [exe, "judge", str(dir_ / f"{variant}.safetensors"), str(dir_ / "ref.safetensors"),
            str(dir_ / "truth.safetensors"), "--no-progress", "-o", "/dev/null"]
    if variant != "apart":
        args += ["--map", str(dir_ / f"{variant}.json")]
    start = time.perf_counter()
    proc = subprocess.run(args, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"{variant}: exit {proc.returncode}\n{proc.stderr}")
    return seconds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--numalign", default="build/numalign")
    ap.add_argument("--rows", type=int, default=8192)
    ap.add_argument("--width", type=int, default=2048)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    variants = ["apart", "fused_last", "fused_first", "transposed"]
    with tempfile.TemporaryDirectory() as tmp:
        dir_ = Path(tmp)
        write(dir_, args.rows, args.width)
        for v in variants:  # warm the page cache
            judge_seconds(args.numalign, dir_, v)
        times = {v: [] for v in variants}
        for _ in range(args.repeat):
            for v in variants:
                times[v].append(judge_seconds(args.numalign, dir_, v))
    gb = 3 * args.rows * args.width * (4 + 4 + 8) / 1e9
    base = statistics.median(times["apart"])
    print(f"q, k, v of [{args.rows}, {args.width}] float32 (truth float64): {gb:.2f} GB read, "
          f"median of {args.repeat} runs")
    print("| variant | seconds | vs apart |")
    print("| --- | ---: | ---: |")
    for v in variants:
        m = statistics.median(times[v])
        print(f"| {v} | {m:.3f} | {m / base:.2f}x |")


if __name__ == "__main__":
    main()
