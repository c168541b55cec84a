"""test_allreduce_fusion.py: examples/allreduce_fusion on 2 gloo ranks: the fused all-reduce
+ residual kernel, its truncating and 2-ULP-planted variants, swept over m x hidden x
magnitude x operand signs, each case tagged with its kernel path, judged with exact, ulp:1,
rmse and abs:0.13 against a float64 truth (DESIGN section 2's claims, measured here)."""
import sys
from pathlib import Path

from test_distributed import run_ranks

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples" / "allreduce_fusion"))
import allreduce  # noqa: E402
import judge_sweep as fusion  # noqa: E402


def _sweep(rank, world, out_dir):
    runs, tags = allreduce.sweep()
    if rank != 0:
        return None
    reports = fusion.judge_all(runs, tags)
    mixed_fail = next(t for t in reports["fused", "ulp:1"].tensors
                      if t["verdict"] == "fail" and tags[t["name"]]["signs"] == "mixed")
    return {"signs": fusion.summary(reports, "signs"),
            "magnitude": fusion.summary(reports, "magnitude"),
            "path": fusion.summary(reports, "path"),
            "fused_ulp_reason": mixed_fail["reason"],
            "max_fused_rmse_ratio": max(t["ratio"] for t in reports["fused", "rmse"].tensors),
            "text": fusion.report_text(reports)}


def test_which_rule_catches_what(tmp_path):
    r = run_ranks(_sweep, 2, tmp_path, timeout=300)[0]
    print(r["text"])
    signs, magnitude = r["signs"], r["magnitude"]
    every = lambda cells: all(p == n for p, n in cells.values())  # noqa: E731
    none = lambda cells: all(p == 0 for p, _ in cells.values())  # noqa: E731
    fused, truncating, sparse = signs["fused"], signs["truncating"], signs["sparse_2ulp"]
    # The fused kernel fails exact and passes rmse at every magnitude: it is more accurate.
    assert none(fused["exact"]) and every(fused["rmse"])
    assert r["max_fused_rmse_ratio"] < 1
    # ulp:1 passes it where the operands share a sign and fails it where they cancel, and
    # the reason says why.
    assert fused["ulp:1"]["same"][0] == fused["ulp:1"]["same"][1]
    assert fused["ulp:1"]["mixed"][0] == 0
    assert "explodes where values cancel" in r["fused_ulp_reason"]
    # The engine's abs:0.13 passes it at small magnitudes and falsely fails it from 16 up.
    abs_fused = magnitude["fused"]["abs:0.13"]
    assert abs_fused["1"][0] == abs_fused["1"][1]
    assert abs_fused["16"][0] == 0 and abs_fused["256"][0] == 0
    # A truncating kernel passes rmse (and ulp:1 without cancellation); the bias check fails it.
    assert every(truncating["rmse"]) and truncating["ulp:1"]["same"][0] == truncating["ulp:1"]["same"][1]
    assert none(truncating["rmse+bias"])
    # A 2-ULP error on 1% of the elements fails ulp:1 everywhere and passes rmse.
    assert none(sparse["ulp:1"]) and every(sparse["rmse"])
    # Both kernel paths are in the sweep.
    assert set(r["path"]["fused"]["exact"]) == {"1-stage", "2-stage"}
