"""rules.py: the verdict of every rule of the study on a list of cases: numalign's rules and the
fixed tolerances users pick instead (torch.testing.assert_close's defaults, atol = rtol = X, as
numalign's allclose rule) through the core (numalign.judge, all cases in one call per rule),
and one bf16 ULP of the largest value, written here from its definition."""
from __future__ import annotations

import math

import torch

import numalign

from corpus import F64, rows_of

UNIT_ROUNDOFF = {"bf16": 2.0 ** -8, "fp16": 2.0 ** -11, "fp32": 2.0 ** -24}

# numalign's rules: (label, judge keyword arguments).
NUMALIGN_RULES = [
    ("numalign measured (the default)", {}),
    ("numalign same (same()'s rule, the former default)", {"rules": "same"}),
    ("numalign same + --check-bias", {"rules": "same", "check_bias": True}),
    ("numalign ulp:1", {"rules": "ulp:1"}),
    ("numalign abs:0.13", {"rules": "abs:0.13"}),
    # The fixed tolerances users pick, through the allclose rule, which decides as
    # torch.testing.assert_close does (tests/python/test_allclose_rule.py checks it against it).
    ("assert_close defaults", {"rules": "allclose"}),
    ("atol = rtol = 1e-2", {"rules": {"*": ("allclose:0.01,0.01", "a fixed tolerance users pick")}}),
    ("atol = rtol = 4e-2", {"rules": {"*": ("allclose:0.04,0.04", "a fixed tolerance users pick")}}),
    ("atol = rtol = 9e-2", {"rules": {"*": ("allclose:0.09,0.09", "a fixed tolerance users pick")}}),
]


def judge_results(cases, **options):
    """numalign's result of each case (a dict of report.tensors), every case in one judgement."""
    test = {f"c{i}": c.test for i, c in enumerate(cases)}
    ref = {f"c{i}": c.ref for i, c in enumerate(cases)}
    truth = {f"c{i}": c.truth for i, c in enumerate(cases)}
    report = numalign.judge(test, ref, truth, **options)
    by_name = {t["name"]: t for t in report.tensors}
    return [by_name[f"c{i}"] for i in range(len(cases))]


def judge_flags(cases, **options):
    """[True where numalign does not pass the case] for one rule."""
    return [t["verdict"] != "pass" for t in judge_results(cases, **options)]


def bias_check_flags(cases):
    """[True where the core's bias check would fail the case] (its `bias.would_fail` under the
    same rule, where it is the check alone: the default rule's adds its 0.3 floor)."""
    return [t["bias"]["would_fail"] for t in judge_results(cases, rules="same")]


def bf16_ulp_of_largest_flag(c):
    """max|test - ref| <= one bf16 ULP at the largest |ref| (the inference engine's 0.13 made
    relative: 2^(floor(log2 max|ref|) - 7))."""
    r = c.ref.to(F64)
    largest = float(r.abs().max())
    ulp = 2.0 ** (math.floor(math.log2(largest)) - 7) if largest > 0 else 0.0
    diff = (c.test.to(F64) - r).abs()
    return bool(torch.isnan(diff).any()) or float(diff.max()) > ulp


USER_RULES = [
    ("1 bf16 ULP of the largest value", bf16_ulp_of_largest_flag),
]


def all_flags(cases):
    """{rule label: [flagged per case]} for every rule of the study."""
    flags = {}
    for label, options in NUMALIGN_RULES:
        flags[label] = judge_flags(cases, **options)
    for label, fn in USER_RULES:
        flags[label] = [fn(c) for c in cases]
    return flags


# ---------------------------------------------------------------------------------------------
# Statistics a measured rule could decide on, for the threshold sweeps (ROC points).


def _rmse(x):
    return float(x.pow(2).mean().sqrt())


def statistics(c):
    """The ratios of a case, each test's measure over ref's, against the truth:
    rmse: whole-tensor RMSE; row: the worst row's RMSE over ref's worst row; max: the largest
    element error over ref's; each with ref's measure floored at half a unit roundoff of the
    truth's RMS magnitude (u/2 x RMS(truth)) so that a reference that rounds the exact result
    does not make the allowance vanish."""
    t, r, u = c.test.to(F64), c.ref.to(F64), c.truth
    et, er = t - u, r - u
    floor = 0.5 * UNIT_ROUNDOFF[c.dtype] * _rmse(u)
    finite = bool(torch.isfinite(t).all())

    def ratio(num, den):
        if not finite:
            return math.inf
        den = max(den, floor)
        return num / den if den > 0 else (math.inf if num > 0 else 0.0)

    return {
        "rmse": ratio(_rmse(et), _rmse(er)),
        "row": ratio(float(rows_of(et).pow(2).mean(1).sqrt().max()),
                     float(rows_of(er).pow(2).mean(1).sqrt().max())),
        "max": ratio(float(et.abs().max()), float(er.abs().max())),
    }

