"""test_allclose_rule.py: the allclose:ATOL,RTOL rule against torch.testing.assert_close itself,
the oracle users port from: the same verdict and the same count of mismatched elements, on
cases placed at the bound, for every floating dtype and for the defaults."""
import re

import pytest
import torch

import numalign

DTYPES = [torch.bfloat16, torch.float16, torch.float32, torch.float64]


def _assert_close_result(test, ref, atol=None, rtol=None):
    """(passed, mismatched count) as assert_close reports them."""
    kw = {} if atol is None else {"atol": atol, "rtol": rtol}
    try:
        torch.testing.assert_close(test, ref, **kw)
        return True, 0
    except AssertionError as e:
        return False, int(re.search(r"Mismatched elements: (\d+) /", str(e)).group(1))


def _near_the_bound(dtype, atol, rtol, seed):
    """ref, and test placed a few steps of the dtype below, at and above the bound."""
    g = torch.Generator().manual_seed(seed)
    ref = (torch.randn(512, generator=g, dtype=torch.float64) *
           torch.exp2(torch.randint(-8, 8, (512,), generator=g).double())).to(dtype)
    r = ref.double()
    bound = atol + rtol * r.abs()
    sign = torch.where(torch.rand(512, generator=g, dtype=torch.float64) < 0.5, -1.0, 1.0)
    scale = 1 + (torch.randint(-3, 4, (512,), generator=g).double() * 2.0 ** -9)
    return (r + sign * bound * scale).to(dtype), ref


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("tolerances", [None, (1e-3, 1e-2), (0.0, 0.05), (1e-2, 0.0)])
def test_same_verdict_and_count_as_assert_close(dtype, tolerances):
    for seed in range(4):
        if tolerances is None:
            atol, rtol = {torch.bfloat16: (1e-5, 1.6e-2), torch.float16: (1e-5, 1e-3),
                          torch.float32: (1e-5, 1.3e-6), torch.float64: (1e-7, 1e-7)}[dtype]
            rule = "allclose"
        else:
            atol, rtol = tolerances
            rule = f"allclose:{atol!r},{rtol!r}"
        test, ref = _near_the_bound(dtype, atol, rtol, seed)
        passed, mismatched = _assert_close_result(
            test, ref, *(tolerances if tolerances else (None, None)))
        report = numalign.judge({"y": test}, {"y": ref},
                                rules={"*": (rule, "the oracle's tolerances")})
        t = report["y"]
        assert (t["verdict"] == "pass") == passed, (dtype, rule, seed, t["reason"])
        assert t["reason"].startswith(f"{mismatched} / 512 elements"), t["reason"]


def test_nan_and_inf_as_assert_close():
    ref = torch.tensor([float("nan"), float("inf"), 1.0, 2.0])
    for test in (torch.tensor([float("nan"), float("inf"), 1.0, 2.0]),
                 torch.tensor([1.0, float("inf"), 1.0, 2.0]),
                 torch.tensor([float("nan"), -float("inf"), 1.0, 2.0])):
        for equal_nan in (False, True):
            try:
                torch.testing.assert_close(test, ref, equal_nan=equal_nan)
                passed = True
            except AssertionError:
                passed = False
            report = numalign.judge({"y": test}, {"y": ref}, rules="allclose", equal_nan=equal_nan)
            assert report.aligned == passed, (test, equal_nan, report["y"]["reason"])


def test_tolerances_beyond_assert_closes_defaults_need_a_reason():
    y = {"y": torch.ones(4)}
    with pytest.raises(Exception, match="beyond assert_close's loosest defaults"):
        numalign.judge(y, y, rules="allclose:0.01,0.01")
    assert numalign.judge(y, y, rules={"*": ("allclose:0.01,0.01", "ported as it was")}).aligned
    assert numalign.judge(y, y, rules="allclose:1e-5,1e-3").aligned  # fp16's defaults: no reason
