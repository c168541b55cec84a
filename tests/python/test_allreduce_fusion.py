"""test_allreduce_fusion.py: examples/allreduce_fusion on 2 gloo ranks: the fused all-reduce
+ residual + RMSNorm kernel, its truncating and 2-ULP-planted variants, swept over m x hidden x
magnitude x operand signs, each case tagged with its kernel path, judged with exact, ulp:1,
same()'s rule, abs:0.13 and the default rule against a float64 truth (the claims of docs/architecture.md, "The rules",
measured here)."""
import sys
from pathlib import Path

import torch.distributed as dist
from test_distributed import run_ranks

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples" / "allreduce_fusion"))
import allreduce  # noqa: E402
import judge_sweep as fusion  # noqa: E402


def _sweep(out_dir):
    runs, tags = allreduce.sweep()
    if dist.get_rank() != 0:
        return None
    reports = fusion.judge_all(runs, tags)
    mixed_fail = next(t for t in reports["fused", "ulp:1"].tensors
                      if t["verdict"] == "fail" and tags[t["name"]]["signs"] == "mixed")
    fused_norms = [t for t in reports["fused", "same"].tensors if t["name"].endswith(".norm")]
    return {"signs": fusion.summary(reports, "output", "signs"),
            "magnitude": fusion.summary(reports, "output", "magnitude"),
            "path": fusion.summary(reports, "path"),
            "fused_ulp_reason": mixed_fail["reason"],
            "max_fused_rmse_ratio": max(t["ratio"] for t in reports["fused", "same"].tensors),
            "max_fused_norm_ulp": {s: max(t["max_ulp"] for t in fused_norms
                                          if tags[t["name"]]["signs"] == s) for s in ("mixed", "same")},
            "text": fusion.report_text(reports)}


def test_which_rule_catches_what(tmp_path):
    r = run_ranks(_sweep, 2, tmp_path)[0]
    print(r["text"])
    every = lambda cells: all(p == n for p, n in cells.values())  # noqa: E731
    none = lambda cells: all(p == 0 for p, _ in cells.values())  # noqa: E731

    def output(by_tag, variant, rule, out):  # the cells of one output ("residual", "norm")
        return {k: v for k, v in by_tag[variant][rule].items() if k.startswith(out + " ")}

    signs, magnitude = r["signs"], r["magnitude"]
    for out in ("residual", "norm"):
        # The fused kernel fails exact and passes same and the default rule at every
        # magnitude: it is more accurate.
        assert none(output(signs, "fused", "exact", out)) and every(output(signs, "fused", "same", out))
        assert every(output(signs, "fused", "measured", out))
        # A truncating kernel passes same; its bias check, and the default rule's, fail it.
        assert every(output(signs, "truncating", "same", out))
        assert none(output(signs, "truncating", "same+bias", out))
        assert none(output(signs, "truncating", "measured", out))
        # A 2-ULP error on 1% of the elements fails ulp:1 everywhere and passes same.
        assert none(output(signs, "sparse_2ulp", "ulp:1", out))
        assert every(output(signs, "sparse_2ulp", "same", out))
    assert r["max_fused_rmse_ratio"] < 1
    # Residual stream: ulp:1 passes the fused kernel where the operands share a sign and
    # fails it where they cancel, and the reason says why.
    fused_ulp = signs["fused"]["ulp:1"]
    assert fused_ulp["residual same"][0] == fused_ulp["residual same"][1]
    assert fused_ulp["residual mixed"][0] == 0
    assert "explodes where values cancel" in r["fused_ulp_reason"]
    truncating_ulp = signs["truncating"]["ulp:1"]
    assert truncating_ulp["residual same"][0] == truncating_ulp["residual same"][1]
    # The engine's abs:0.13 passes it at small magnitudes and falsely fails it from 16 up.
    abs_fused = magnitude["fused"]["abs:0.13"]
    assert abs_fused["residual 1"][0] == abs_fused["residual 1"][1]
    assert abs_fused["residual 16"][0] == 0 and abs_fused["residual 256"][0] == 0
    # The norm reads the unrounded stream, so it is up to 2 ULPs off the reference's where
    # operands share a sign (and cancels like the stream where they do not): ulp:1 fails
    # nearly every case, though same shows it more accurate. Its output is of unit scale,
    # where abs:0.13 passes everything, the truncation and the planted error too.
    assert r["max_fused_norm_ulp"]["same"] == 2 and r["max_fused_norm_ulp"]["mixed"] > 1000
    assert fused_ulp["norm mixed"][0] + fused_ulp["norm same"][0] == 1
    for variant in ("fused", "truncating", "sparse_2ulp"):
        assert every(output(magnitude, variant, "abs:0.13", "norm"))
    # Both kernel paths are in the sweep.
    assert set(r["path"]["fused"]["exact"]) == {"1-stage", "2-stage"}
