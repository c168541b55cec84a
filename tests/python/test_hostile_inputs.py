"""test_hostile_inputs.py: NaN / Inf in every position, empty and 0-d tensors, 100,000 tensors
in one file, mismatched nesting and wrong types: defined verdicts and clear errors."""
import itertools
import json

import numpy as np
import pytest
import torch
from safetensors.torch import save_file
from torch._dynamo.utils import same

import numalign

SPECIALS = {"finite": None, "nan": float("nan"), "+inf": float("inf"), "-inf": float("-inf")}


@pytest.mark.parametrize("equal_nan", [False, True])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_every_nonfinite_combination_follows_same(dtype, equal_nan):
    """One element of test, ref and truth set to each of finite / NaN / +inf / -inf (64
    combinations): the same rule's verdict is same()'s."""
    g = torch.Generator().manual_seed(0)
    base = torch.randn(2000, dtype=torch.float64, generator=g)
    tests, refs, truths = {}, {}, {}
    for i, (a, b, c) in enumerate(itertools.product(SPECIALS, repeat=3)):
        t, r, u = (base + 1e-2 * torch.randn(2000, dtype=torch.float64, generator=g)).to(dtype), base.to(dtype), base.clone()
        for tensor, kind in ((t, a), (r, b), (u, c)):
            if SPECIALS[kind] is not None:
                tensor[7] = SPECIALS[kind]
        name = f"{i:02d}.test_{a}.ref_{b}.truth_{c}"
        tests[name], refs[name], truths[name] = t, r, u
    report = numalign.judge(tests, refs, truths, equal_nan=equal_nan, rules="same")
    for name in tests:
        expected = same(refs[name], tests[name], fp64_ref=truths[name], equal_nan=equal_nan,
                        log_error=lambda *a: None)
        got = report[name]
        assert got["verdict"] in ("pass", "fail"), got
        assert (got["verdict"] == "pass") == expected, (name, got["reason"])
        assert got["nonfinite"]["test"]["nan"] + got["nonfinite"]["test"]["inf"] == ("test_finite" not in name)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_every_nonfinite_combination_under_the_default_rule(dtype):
    """The measured rule (the default) on the same 64 combinations: ref and truth unlike at
    the element -> could not judge; test unlike them -> fail; all three alike -> the verdict
    and ratio of the same tensors with that element removed (the oracle)."""
    g = torch.Generator().manual_seed(1)
    base = torch.randn(2000, dtype=torch.float64, generator=g)
    noise = 1e-3 if dtype == torch.bfloat16 else 1e-8
    keep = torch.ones(2000, dtype=torch.bool)
    keep[7] = False
    tests, refs, truths = {}, {}, {}
    for i, (a, b, c) in enumerate(itertools.product(SPECIALS, repeat=3)):
        t = (base + noise * torch.randn(2000, dtype=torch.float64, generator=g)).to(dtype)
        r, u = base.to(dtype), base.clone()
        for tensor, kind in ((t, a), (r, b), (u, c)):
            if SPECIALS[kind] is not None:
                tensor[7] = SPECIALS[kind]
        tests[f"{i:02d}.test_{a}.ref_{b}.truth_{c}"] = t
        refs[f"{i:02d}.test_{a}.ref_{b}.truth_{c}"] = r
        truths[f"{i:02d}.test_{a}.ref_{b}.truth_{c}"] = u
    report = numalign.judge(tests, refs, truths)
    seen = set()
    for name in tests:
        _, a, b, c = (part.split("_", 1)[-1] for part in name.split("."))
        got = report[name]
        if b != c:
            assert got["verdict"] == "error" and "ref and truth differ in NaN or Inf" in got["reason"], got
        elif a != b:
            assert got["verdict"] == "fail" and "test differs from ref and truth" in got["reason"], got
        else:
            kept = keep if a != "finite" else torch.ones(2000, dtype=torch.bool)
            alone = numalign.judge({"x": tests[name][kept]}, {"x": refs[name][kept]},
                                   {"x": truths[name][kept]})["x"]
            assert (got["verdict"], got["ratio"]) == (alone["verdict"], alone["ratio"]), (got, alone)
        seen.add(got["verdict"])
    assert seen == {"pass", "fail", "error"}, seen
    assert report["63.test_-inf.ref_-inf.truth_-inf"]["verdict"] == "pass"


def test_nonfinite_semantics_of_the_other_rules():
    nan = float("nan")
    a = torch.tensor([1.0, nan, 3.0])
    b = torch.tensor([1.0, nan, 3.0])
    for rule in ("ulp:0", "abs:0"):
        assert not numalign.judge({"x": a}, {"x": b}, rules=rule).aligned, rule
        assert numalign.judge({"x": a}, {"x": b}, rules=rule, equal_nan=True).aligned, rule
    assert numalign.judge({"x": a}, {"x": b}, rules="exact").aligned  # same bits
    inf = torch.tensor([float("inf")])
    assert numalign.judge({"x": inf}, {"x": inf}, rules="ulp:0").aligned
    assert not numalign.judge({"x": inf}, {"x": -inf}, rules={"x": ("ulp:1000", "far apart")}).aligned


def test_empty_and_scalar_tensors():
    report = numalign.judge({"e": torch.zeros(0, 3), "s": torch.tensor(1.5)},
                            {"e": torch.zeros(0, 3), "s": torch.tensor(1.5)},
                            {"e": torch.zeros(0, 3, dtype=torch.float64), "s": torch.tensor(1.5, dtype=torch.float64)})
    assert report.aligned
    assert report["e"]["numel"] == 0 and report["s"]["shape"] == []


def test_one_hundred_thousand_tensors(cli, tmp_path):
    tensors = {f"layer.{i}.w": torch.full((2,), float(i)) for i in range(100_000)}
    path = tmp_path / "many.safetensors"
    save_file(tensors, path)
    proc = cli("compare", path, path, "--format", "json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["summary"]["passed"] == 100_000


def test_mismatched_nesting_fails_by_name_not_by_crash():
    t = torch.ones(4)
    report = numalign.judge({"a": [t, t]}, {"a": (t,)})
    assert [x["name"] for x in report.tensors] == ["a.0"]  # a.1 is only in test: listed, not judged
    assert any("only in test" in w for w in report.warnings)
    report = numalign.judge([t], {"out": t})
    assert report["out"]["reason"] == "missing from test"


def test_wrong_types_and_dtypes_raise_type_errors():
    with pytest.raises(TypeError, match="'x'"):
        numalign.judge({"x": "not a tensor"}, {"x": torch.ones(1)})
    with pytest.raises(TypeError, match="dtype"):
        numalign.judge({"x": np.ones(2, dtype=np.complex64)}, {"x": np.ones(2, dtype=np.complex64)})
    with pytest.raises(TypeError):
        numalign.judge({"x": torch.ones(2)}, {"x": object()})


def test_non_contiguous_and_dtype_mismatch():
    m = torch.randn(64, 32, dtype=torch.float64)
    report = numalign.judge({"m": m.t().float()}, {"m": m.t().contiguous().float()}, {"m": m.t()})
    assert report.aligned and report["m"]["shape"] == [32, 64]
    report = numalign.judge({"m": m.float()}, {"m": m.half()})
    assert report["m"]["reason"] == "dtype mismatch: test F32, ref F16"
