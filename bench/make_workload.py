"""Writes the benchmark's traces: test, ref and a float64 truth, as safetensors files.

Two workloads, both scaled by --scale (1.0 is the size the issue asks for):
  model      a few tensors of 64 Mi elements and thousands of 1k-100k elements (log-uniform),
             about 3.4 GB in all at scale 1 with bf16 test and ref
  many_small 10,000 tensors of 1,000 elements

The truth is a float64 draw; ref is the truth rounded to the dtype and test the truth with a
small relative perturbation rounded to the dtype, as a ported kernel's output would be.
Files are written with the safetensors reference implementation.
"""

import argparse
import json
import math
import os
from pathlib import Path

import torch
from safetensors.torch import save_file

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32,
          "fp8": torch.float8_e4m3fn}


def tensor_sizes(workload, scale, rng):
    if workload == "many_small":
        return [1000] * max(1, round(10_000 * scale))
    big = [max(1, round((64 << 20) * scale))] * 3
    small_count = max(1, round(4000 * scale))
    small = [int(math.exp(rng.uniform(math.log(1e3), math.log(1e5)))) for _ in range(small_count)]
    return big + small


def make(workload, dtype_name, scale, out_dir, seed=0):
    """Writes out_dir/{test,ref,truth}.safetensors unless they are there for these arguments."""
    import random

    out_dir = Path(out_dir)
    spec = {"workload": workload, "dtype": dtype_name, "scale": scale, "seed": seed}
    stamp = out_dir / "spec.json"
    if stamp.exists() and json.loads(stamp.read_text()) == spec:
        return out_dir
    out_dir.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    dtype = DTYPES[dtype_name]
    test, ref, truth = {}, {}, {}
    for i, n in enumerate(tensor_sizes(workload, scale, rng)):
        name = f"t{i:05d}"
        u = torch.randn(n, dtype=torch.float64, generator=gen)
        # fp8 has 3 mantissa bits: keep values inside its range and the noise at its scale.
        noise = torch.randn(n, dtype=torch.float32, generator=gen)
        rel = 2.0 ** -9 if dtype_name != "fp8" else 2.0 ** -4
        truth[name] = u
        ref[name] = u.to(dtype)
        test[name] = (u * (1 + rel * noise.double())).to(dtype)
        del noise
    # Largest files first: the truth alone is most of the memory a dict of them holds.
    for label, tensors in (("truth", truth), ("ref", ref), ("test", test)):
        tmp = out_dir / f".{label}.safetensors.tmp"
        save_file(tensors, str(tmp))
        os.replace(tmp, out_dir / f"{label}.safetensors")
        tensors.clear()
    stamp.write_text(json.dumps(spec))
    return out_dir


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out_dir")
    p.add_argument("--workload", choices=["model", "many_small"], default="model")
    p.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    p.add_argument("--scale", type=float, default=1.0)
    a = p.parse_args()
    print(make(a.workload, a.dtype, a.scale, a.out_dir))


if __name__ == "__main__":
    main()
