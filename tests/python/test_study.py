"""test_study.py: the rule study's own pieces (study/): its roundings against independent
oracles, its labels, and that judging every case in one call gives each case's own verdict."""
import math
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import numalign

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "study"))
import corpus  # noqa: E402
import rules  # noqa: E402


def _samples(n=20000, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, generator=g, dtype=torch.float64) * torch.exp2(
        torch.randint(-20, 20, (n,), generator=g).double())
    return x


def test_truncation_to_bf16_is_the_bit_shift():
    x = _samples().float()
    shifted = ((x.view(torch.int32) >> 16) << 16).view(torch.float32)  # aiter #5151's shift
    assert torch.equal(corpus.trunc(x, torch.bfloat16).float(), shifted)


@pytest.mark.parametrize("dt", [torch.float16, torch.float32])
def test_truncation_rounds_toward_zero(dt):
    x = _samples()
    if dt == torch.float16:
        x = x.clamp(-60000, 60000)
    y = corpus.trunc(x, dt)
    assert bool((y.double().abs() <= x.abs()).all())
    # the next value away from zero is beyond x: y is the nearest toward zero
    away = torch.nextafter(y, torch.where(x >= 0, torch.tensor(math.inf, dtype=dt),
                                          torch.tensor(-math.inf, dtype=dt)))
    assert bool((away.double().abs() > x.abs()).all())


def test_tf32_keeps_ten_mantissa_bits_rounding_to_nearest():
    x = _samples().float()
    y = corpus.tf32(x)
    assert bool(((y.view(torch.int32) & 0x1FFF) == 0).all())
    ulp = torch.exp2(torch.floor(torch.log2(x.abs().double())) - 10)
    assert bool(((y.double() - x.double()).abs() <= ulp / 2).all())


def test_low_precision_accumulator_stores_between_tiles():
    x = torch.full((1, 4096), 1.0 + 2.0 ** -9, dtype=torch.float64)
    # each tile sums to 32 (1 + 2^-9) exactly in float32, which bf16 (8 bits) stores as 32:
    # the stored running total loses 2^-9 per term, a float32 one keeps it
    assert float(corpus.lowacc_sum(x, 1, torch.bfloat16)) == 4096.0
    assert float(corpus.lowacc_sum(x, 1, torch.float32)) == float(x.sum())


def test_labels_mark_a_bug_effective_only_outside_what_correct_code_does():
    truth = torch.linspace(1, 2, 64 * 32, dtype=torch.float64).reshape(64, 32)
    ref = truth.to(torch.bfloat16)
    other = (truth * (1 + 2.0 ** -12)).to(torch.bfloat16)  # correct, rounds elsewhere
    worse_row = ref.clone()
    worse_row[5] = (truth[5] * 1.01).to(torch.bfloat16)    # one row 1% off
    same_as_ref = ref.clone()
    cases = [corpus.Case("k", "bf16", 1, "normal", 0, v, lab, test=t, ref=ref, truth=truth)
             for v, lab, t in [("ref", "correct", ref), ("other", "correct", other),
                               ("row", "bug", worse_row), ("noop", "bug", same_as_ref)]]
    corpus.label(cases, truth)
    assert [c.effective for c in cases] == [False, False, True, False]


def test_truncation_is_effective_by_its_bias():
    g = torch.Generator().manual_seed(1)
    truth = torch.randn(4096, generator=g, dtype=torch.float64)
    ref = truth.to(torch.bfloat16)
    # a correct variant with a little more, unbiased, error (another rounding point)
    noise = torch.randn(4096, generator=g, dtype=torch.float64) * 2.0 ** -9 * truth.abs()
    other = (truth + noise).to(torch.bfloat16)

    def case(variant, label, test):
        return corpus.Case("k", "bf16", 1, "normal", 0, variant, label, test=test, ref=ref,
                           truth=truth)

    cases = [case("ref", "correct", ref), case("other", "correct", other),
             case("trunc", "bug", corpus.trunc(truth, torch.bfloat16))]
    corpus.label(cases, truth)
    assert cases[2].effective and cases[2].bias_only


def test_one_judgement_of_every_case_gives_each_case_its_own_verdict():
    cases, _ = corpus.build(seeds=(0,), magnitudes=(1e-3, 1.0), distributions=("normal",),
                            kernels=[corpus.Softmax(), corpus.Cumsum()])
    together = rules.judge_flags(cases)
    alone = [not numalign.judge({"y": c.test}, {"y": c.ref}, {"y": c.truth}).aligned
             for c in cases]
    assert together == alone
    assert any(together) and not all(together)  # the sample holds both verdicts


def test_user_rules_follow_their_definitions():
    ref = torch.tensor([1.0, 100.0], dtype=torch.bfloat16)
    truth = ref.double()
    near = corpus.Case("k", "bf16", 1, "normal", 0, "v", "bug",
                       test=torch.tensor([1.0, 101.0], dtype=torch.bfloat16), ref=ref, truth=truth)
    flags = dict(zip([label for label, _ in rules.NUMALIGN_RULES],
                     [rules.judge_flags([near], **o)[0] for _, o in rules.NUMALIGN_RULES]))
    # assert_close bf16: 1e-5 + 1.6e-2 * 100 >= 1; atol = rtol = 1e-2: 0.01 + 0.01 * 100 >= 1
    assert not flags["assert_close defaults"] and not flags["atol = rtol = 1e-2"]
    # one bf16 ULP at 100 is 0.5: a difference of 1 is beyond it
    assert rules.bf16_ulp_of_largest_flag(near)
    np.testing.assert_equal(rules.statistics(near)["max"] > 1, True)


# The blind spots of same()'s rule that issue 34 names, each by a case of its class that the
# default (same()) passes: the measured rule fails each, and passes every correct variant of
# the same configuration.
BLIND_SPOTS = [
    # small values: the allclose fast path's absolute tolerance decides
    ("softmax", corpus.Softmax(), "fp32", 1e-3, "rows_off"),
    ("matmul_k512", corpus.Matmul(512), "fp32", 1e-3, "tf32_on"),
    # localized: whole-tensor RMSE averages one wrong row away
    ("softmax", corpus.Softmax(), "bf16", 1.0, "rows_off"),
    # truncation instead of rounding (aiter#5151)
    ("ar_residual", corpus.FusedAllreduceResidualRMSNorm("h"), "bf16", 1.0, "trunc_residual"),
    ("matmul_k512", corpus.Matmul(512), "bf16", 1.0, "trunc"),
    # a low-precision accumulator
    ("matmul_k512", corpus.Matmul(512), "fp16", 1.0, "lowacc"),
]


@pytest.mark.parametrize("name,kernel,dtype,magnitude,bug", BLIND_SPOTS,
                         ids=[f"{b[0]}-{b[2]}-{b[3]:g}-{b[4]}" for b in BLIND_SPOTS])
def test_the_measured_rule_sees_what_same_passes(name, kernel, dtype, magnitude, bug):
    cases, _ = corpus.build(seeds=(0,), dtypes=(dtype,), magnitudes=(magnitude,),
                            distributions=("normal",), kernels=[kernel])
    same = dict(zip([c.variant for c in cases], rules.judge_flags(cases, rules="same")))
    measured = dict(zip([c.variant for c in cases], rules.judge_flags(cases)))  # the default
    assert not same[bug], "same() passes it: the blind spot"
    assert measured[bug]
    assert not any(measured[c.variant] for c in cases if c.label == "correct")


def test_the_measured_rule_in_the_core_is_the_studys_statistics():
    """The core's rule against an independent computation in float64 (rules.statistics): the
    RMSE and worst-element ratios over ref's, floored at u/2 x RMS(truth), limit 3."""
    cases, _ = corpus.build(seeds=(1,), distributions=("normal", "outliers"),
                            kernels=[corpus.Matmul(512), corpus.LayerNorm(), corpus.Attention(),
                                     corpus.Allreduce(8)])
    core = rules.judge_results(cases)  # the default rule, measured
    for c, t in zip(cases, core):
        s = rules.statistics(c)
        assert t["ratio"] == pytest.approx(max(s["rmse"], s["max"]), rel=1e-9), c.key
        biased = t["bias"]["would_fail"] and abs(t["bias"]["eb_test"]) > 0.3
        assert (t["verdict"] == "fail") == (max(s["rmse"], s["max"]) > 3 or biased), c.key
