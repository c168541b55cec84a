"""Override selection at scale: `numalign compare` on N tiny tensors with no override and with
K overrides (the issue's case: 1,000 overrides x 1M tensors), alternating, best of R.

Usage: python bench/override_bench.py --cli build/numalign [--tensors 1000000] [--overrides 1000]
       [--repeat 3] [--kind prefix|suffix|mixed]
Writes the two traces (4 bytes per tensor) and the policy under a temporary folder."""
import argparse
import json
import struct
import subprocess
import tempfile
import time
from pathlib import Path


def write_trace(path: Path, names):
    header, offset = {}, 0
    for n in names:
        header[n] = {"dtype": "F32", "shape": [1], "data_offsets": [offset, offset + 4]}
        offset += 4
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text)
        f.write(struct.pack("<f", 1.0) * len(names))


def overrides(kind, k, layers):
    out = []
    for i in range(k):
        glob = {"prefix": f"layers.{i % layers}.block{i // layers}.*",
                "suffix": f"*.block{i}.weight",
                "mixed": [f"layers.{i % layers}.*", f"*.block{i}.weight", f"*mid{i}*"][i % 3]}[kind]
        out.append({"match": glob, "rule": "ulp:1"})
    return {"default": "exact", "overrides": out}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cli", required=True)
    ap.add_argument("--tensors", type=int, default=1_000_000)
    ap.add_argument("--overrides", type=int, default=1000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--kind", default="prefix", choices=["prefix", "suffix", "mixed"])
    args = ap.parse_args()
    layers = 100
    names = [f"layers.{i % layers}.block{i // layers % 1000}.t{i}.weight" for i in range(args.tensors)]
    with tempfile.TemporaryDirectory() as d:
        d = Path(d)
        write_trace(d / "a.safetensors", names)
        write_trace(d / "b.safetensors", names)
        (d / "none.json").write_text(json.dumps({"default": "exact"}))
        (d / "many.json").write_text(json.dumps(overrides(args.kind, args.overrides, layers)))
        best = {}
        for _ in range(args.repeat):
            for label in ("none", "many"):
                t0 = time.perf_counter()
                proc = subprocess.run([args.cli, "judge", d / "a.safetensors", d / "b.safetensors",
                                       "--policy", d / f"{label}.json", "--format", "json", "-o",
                                       d / "out.json"], capture_output=True)
                elapsed = time.perf_counter() - t0
                assert proc.returncode in (0, 1), proc.stderr
                best[label] = min(best.get(label, elapsed), elapsed)
        print(f"{args.tensors} tensors, {args.overrides} {args.kind} overrides: "
              f"none {best['none']:.2f} s, overrides {best['many']:.2f} s, "
              f"ratio {best['many'] / best['none']:.2f}")


if __name__ == "__main__":
    main()
