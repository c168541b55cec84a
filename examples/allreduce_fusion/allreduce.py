"""allreduce.py: an all-reduce + residual add + RMSNorm in bf16, written as the kernels a
port would compare, on a real torch.distributed group (gloo on CPU here, NCCL/HCCL on
accelerators). Each case has two outputs, as fused kernels write them: the residual stream
(`<case>`) and its RMSNorm (`<case>.norm`, computed in fp32, weighted, rounded to bf16).

- unfused (the reference): the all-reduce sum is rounded to bf16, then the residual is
  added in bf16 (two roundings); the norm reads that bf16 residual stream;
- fused: the residual is added to the fp32 sum before the one rounding to bf16 (the known
  1-ULP variant, and more accurate); the norm reads the fp32 value before that rounding;
- truncating: fused, but truncating to bf16 instead of rounding;
- sparse_2ulp: fused, with a 2-ULP error planted on 1% of the elements;
- truth: the same in float64.

Each case is tagged with its kernel path as an engine would pick it: 1-stage when
m x hidden x 2 bytes <= 128 KiB, else 2-stage (reduce-scatter + all-gather)."""
from __future__ import annotations

import torch
import torch.distributed as dist

MS = (1, 4, 8, 16, 32, 64, 128)
HIDDENS = (512, 2048)
MAGNITUDES = (1.0, 4.0, 16.0, 256.0)
SIGNS = ("mixed", "same")  # random signs (the residual can cancel the sum), or all positive
VARIANTS = ("unfused", "fused", "truncating", "sparse_2ulp")


def path_of(m: int, hidden: int) -> str:
    return "1-stage" if m * hidden * 2 <= 128 * 1024 else "2-stage"


def _truncate_to_bf16(x: torch.Tensor) -> torch.Tensor:
    """fp32 -> bf16 toward zero: the low 16 bits dropped (sign-magnitude)."""
    bits = x.contiguous().view(torch.int32) & ~0xFFFF
    return (bits >> 16).to(torch.int16).view(torch.bfloat16)


def _plant_2ulp(y: torch.Tensor, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    hit = torch.rand(y.shape, generator=g) < 0.01
    bits = y.contiguous().view(torch.int16).clone()
    bits[hit] += 2  # away from zero, for either sign
    return bits.view(torch.bfloat16)


EPS = 1e-6


def _rms_norm(y: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """In y's precision (fp32 in the kernels, float64 for the truth)."""
    return y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + EPS) * weight.to(y.dtype)


def run_case(m: int, hidden: int, magnitude: float, signs: str, seed: int, group=None) -> dict:
    """All variants and the truth of one case on this rank ({name: (residual stream, norm)});
    every rank holds the same results after the all-reduce."""
    rank = dist.get_rank(group)
    g = torch.Generator().manual_seed(seed * 1000 + rank)
    x = torch.randn(m, hidden, generator=g)  # this rank's part
    residual = torch.randn(m, hidden, generator=torch.Generator().manual_seed(seed))
    if signs == "same":
        x, residual = x.abs(), residual.abs()
    x = (x * magnitude).to(torch.bfloat16)
    residual = (residual * magnitude).to(torch.bfloat16)
    s32 = x.float()
    dist.all_reduce(s32, group=group)
    s64 = x.double()
    dist.all_reduce(s64, group=group)
    weight = (1 + 0.1 * torch.randn(hidden, generator=torch.Generator().manual_seed(seed + 10**6)))
    weight = weight.to(torch.bfloat16)
    fused_sum = s32 + residual.float()
    fused = fused_sum.to(torch.bfloat16)
    fused_norm = _rms_norm(fused_sum, weight)
    unfused = s32.to(torch.bfloat16) + residual
    truth = s64 + residual.double()
    return {
        "truth": (truth, _rms_norm(truth, weight)),
        "unfused": (unfused, _rms_norm(unfused.float(), weight).to(torch.bfloat16)),
        "fused": (fused, fused_norm.to(torch.bfloat16)),
        "truncating": (_truncate_to_bf16(fused_sum), _truncate_to_bf16(fused_norm)),
        "sparse_2ulp": (_plant_2ulp(fused, seed), _plant_2ulp(fused_norm.to(torch.bfloat16), seed + 10**6)),
    }


def sweep(group=None) -> dict:
    """{variant or "truth": {case name: tensor}} and {case name: tags} over every case."""
    runs = {v: {} for v in ("truth",) + VARIANTS}
    tags = {}
    seed = 0
    for m in MS:
        for hidden in HIDDENS:
            for magnitude in MAGNITUDES:
                for signs in SIGNS:
                    seed += 1
                    name = f"m{m}.h{hidden}.x{magnitude:g}.{signs}"
                    case = {"path": path_of(m, hidden), "m": str(m), "hidden": str(hidden),
                            "magnitude": f"{magnitude:g}", "signs": signs}
                    for variant, (stream, norm) in run_case(m, hidden, magnitude, signs, seed,
                                                            group).items():
                        runs[variant][name] = stream
                        runs[variant][name + ".norm"] = norm
                    tags[name] = {**case, "output": "residual"}
                    tags[name + ".norm"] = {**case, "output": "norm"}
    return runs, tags
