"""test_same_parity.py: the rmse rule's verdicts equal torch._dynamo.utils.same()'s on random
cases around the pass boundary, for every multiplier branch and option, and on issue 19's
repros."""
import math

import pytest
import torch
from safetensors.torch import save_file
from torch._dynamo.utils import same

import numalign

SHAPES = [(7,), (300,), (999,), (1000,), (4096,), (3, 700, 1, 1), (2, 2, 300)]
DTYPES = [torch.bfloat16, torch.float16, torch.float32, torch.float64]


def make_cases(seed, count, spread):
    g = torch.Generator().manual_seed(seed)
    cases = {}
    for i in range(count):
        dtype = DTYPES[i % len(DTYPES)]
        shape = SHAPES[(i // len(DTYPES)) % len(SHAPES)]
        truth = torch.randn(shape, dtype=torch.float64, generator=g)
        noise = 10 ** float(torch.empty(1).uniform_(-6, -1, generator=g))
        ref = (truth + noise * torch.randn(shape, dtype=torch.float64, generator=g)).to(dtype)
        # Errors spread around the boundary (0.5x to `spread` x the reference's), or within tol.
        if i % 5 == 4:
            test = (ref.double() + 1e-4 * torch.randn(shape, dtype=torch.float64, generator=g)).to(dtype)
        else:
            factor = float(torch.empty(1).uniform_(0.5, spread, generator=g))
            test = (truth + factor * noise * torch.randn(shape, dtype=torch.float64, generator=g)).to(dtype)
        if i % 17 == 3:  # same()'s NaN escape: a NaN in ref only
            ref = ref.clone()
            ref.view(-1)[0] = float("nan")
        cases[f"case{i:03d}"] = (test, ref, truth)
    return cases


@pytest.mark.parametrize("options", [
    {"tol": 1e-4},
    {"tol": 2e-2},
    {"tol": 1e-4, "use_larger_multiplier_for_smaller_tensor": True},
    {"tol": 1e-4, "force_max_multiplier": True},
    {"tol": 1e-3, "equal_nan": True},
], ids=["default", "tol2e-2", "larger-small", "force-max", "equal-nan"])
def test_verdicts_match_same(cli, judge_json, tmp_path, options):
    spread = 15.0 if options.get("force_max_multiplier") else 5.0
    cases = make_cases(seed=len(tmp_path.name), count=140, spread=spread)
    for k, role in enumerate(("test", "ref", "truth")):
        save_file({n: c[k].contiguous() for n, c in cases.items()}, tmp_path / f"{role}.safetensors")
    flags = ["--tol", repr(options["tol"])]
    if options.get("use_larger_multiplier_for_smaller_tensor"):
        flags.append("--larger-multiplier-for-small")
    if options.get("force_max_multiplier"):
        flags.append("--force-max-multiplier")
    if options.get("equal_nan"):
        flags.append("--equal-nan")
    report = judge_json(tmp_path / "test.safetensors", tmp_path / "ref.safetensors",
                        tmp_path / "truth.safetensors", *flags)
    ours = {t["name"]: t for t in report["tensors"]}
    outcomes = {"pass": 0, "fail": 0}
    for name, (test, ref, truth) in cases.items():
        expected = same(ref, test, fp64_ref=truth, log_error=lambda *a: None, **options)
        got = ours[name]["verdict"]
        assert got in ("pass", "fail"), ours[name]
        assert (got == "pass") == expected, (name, test.dtype, tuple(test.shape), ours[name]["reason"])
        outcomes[got] += 1
        if ours[name]["error"] is not None and ours[name]["ratio"] is not None and not math.isnan(ours[name]["error"]):
            res_error = torch.sqrt(torch.mean(torch.square(truth - test))).item()
            assert ours[name]["error"] == pytest.approx(res_error, rel=1e-12, abs=1e-300)
    # The cases straddle the boundary: both outcomes occur, so the comparison means something.
    assert outcomes["pass"] >= 10 and outcomes["fail"] >= 10, outcomes


def tensors(dtype, test, ref, truth):
    return (torch.tensor(test, dtype=dtype), torch.tensor(ref, dtype=dtype),
            torch.tensor(truth, dtype=torch.float64))


# The issue's repros (numel 1; same() with torch 2.13 gives the expected verdicts).
REPROS = {
    # bf16 at tol 0.02: atol rounds to 0.02001953125 in bf16, and allowed = 0.0350146...
    # rounds to a tie that goes up to 0.03515625 = |ref - test|: allclose passes.
    "bf16-allclose": (torch.bfloat16, 0.02, 0.75, 0.71484375, 0.7181009319334107, True),
    # fp16 at tol 0.03: atol is 0.029998779296875 in fp16, allowed rounds down to
    # 0.03009033203125 < |ref - test| = 0.0301055908203125: not close, and the rmse fails.
    "fp16-allclose": (torch.float16, 0.03, -0.003276824951171875, 0.026824951171875,
                      0.026824951171875, False),
    # fp16 NaN escape: truth.to(fp16) = 1.4365234375 against test 1.3427734375 at 4e-2: the
    # allowance 0.04 + 0.04 * 1.34 rounds to 0.09375 with atol in fp16, = |difference|.
    "fp16-nan-escape": (torch.float16, 1e-4, 1.3427734375, math.nan, 1.4365234375, True),
}


@pytest.mark.parametrize("name", list(REPROS))
def test_issue_repros(name):
    dtype, tol, test, ref, truth, verdict = REPROS[name]
    t, r, u = tensors(dtype, [test], [ref], [truth])
    assert same(r, t, fp64_ref=u, tol=tol, log_error=lambda *a: None) is verdict
    report = numalign.judge({"x": t}, {"x": r}, {"x": u}, tol=tol)
    assert (report["x"]["verdict"] == "pass") is verdict, report["x"]["reason"]
