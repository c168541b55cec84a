"""rules.py: the verdict of every rule of the study on a list of cases: numalign's rules through
the core (numalign.judge, all cases in one call per rule), and the rules users pick instead
(torch.testing.assert_close's defaults, atol = rtol = X, one bf16 ULP of the largest value),
written here from their definitions (REFERENCES.md)."""
from __future__ import annotations

import math

import torch

import numalign

from corpus import F64, rows_of

# assert_close's defaults (rtol, atol) per dtype.
ASSERT_CLOSE = {"bf16": (1.6e-2, 1e-5), "fp16": (1e-3, 1e-5), "fp32": (1.3e-6, 1e-5)}
UNIT_ROUNDOFF = {"bf16": 2.0 ** -8, "fp16": 2.0 ** -11, "fp32": 2.0 ** -24}

# numalign's rules: (label, judge keyword arguments).
NUMALIGN_RULES = [
    ("numalign same() rule (today's default)", {}),
    ("numalign same() rule + --check-bias", {"check_bias": True}),
    ("numalign ulp:1", {"rules": "ulp:1"}),
    ("numalign abs:0.13", {"rules": "abs:0.13"}),
]


def judge_flags(cases, **options):
    """[True where numalign does not pass the case] for one rule, every case in one judgement."""
    test = {f"c{i}": c.test for i, c in enumerate(cases)}
    ref = {f"c{i}": c.ref for i, c in enumerate(cases)}
    truth = {f"c{i}": c.truth for i, c in enumerate(cases)}
    report = numalign.judge(test, ref, truth, **options)
    status = {t["name"]: t["verdict"] for t in report.tensors}
    return [status[f"c{i}"] != "pass" for i in range(len(cases))]


def _close_flag(test, ref, atol, rtol):
    t, r = test.to(F64), ref.to(F64)
    ok = (t - r).abs() <= atol + rtol * r.abs()
    ok = ok | (t == r)  # equal infinities are close, as in torch
    return not bool(ok.all())


def assert_close_flag(c):
    rtol, atol = ASSERT_CLOSE[c.dtype]
    return _close_flag(c.test, c.ref, atol, rtol)


def tol_flag(x):
    return lambda c: _close_flag(c.test, c.ref, x, x)


def bf16_ulp_of_largest_flag(c):
    """max|test - ref| <= one bf16 ULP at the largest |ref| (the inference engine's 0.13 made
    relative: 2^(floor(log2 max|ref|) - 7))."""
    r = c.ref.to(F64)
    largest = float(r.abs().max())
    ulp = 2.0 ** (math.floor(math.log2(largest)) - 7) if largest > 0 else 0.0
    diff = (c.test.to(F64) - r).abs()
    return bool(torch.isnan(diff).any()) or float(diff.max()) > ulp


USER_RULES = [
    ("assert_close defaults", assert_close_flag),
    ("atol = rtol = 1e-2", tol_flag(1e-2)),
    ("atol = rtol = 4e-2", tol_flag(4e-2)),
    ("atol = rtol = 9e-2", tol_flag(9e-2)),
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
        "bias": bias_fails(t, r, u),
        "rmse": ratio(_rmse(et), _rmse(er)),
        "row": ratio(float(rows_of(et).pow(2).mean(1).sqrt().max()),
                     float(rows_of(er).pow(2).mean(1).sqrt().max())),
        "max": ratio(float(et.abs().max()), float(er.abs().max())),
    }


def _error_balance(x, truth):
    differ = int((x != truth).sum())
    if differ == 0:
        return 0.0, 0
    over, under = int((x.abs() > truth.abs()).sum()), int((x.abs() < truth.abs()).sum())
    return (over - under) / differ, differ


def bias_fails(t, r, u):
    """DESIGN.md's bias check: |EB(test)| above both 4/sqrt(#(t != u)) and 2|EB(ref)| + 0.05."""
    eb_t, n = _error_balance(t, u)
    eb_r, _ = _error_balance(r, u)
    return n > 0 and abs(eb_t) > 4 / math.sqrt(n) and abs(eb_t) > 2 * abs(eb_r) + 0.05
