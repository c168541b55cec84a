"""test_properties.py: invariants of the metrics, checked by hypothesis on generated data."""
import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

import numalign
from numalign import compare

finite64 = st.floats(-1e6, 1e6, allow_nan=False, allow_infinity=False, width=64)
vectors = st.integers(1, 300).flatmap(lambda n: st.tuples(arrays(np.float64, n, elements=finite64),
                                                           arrays(np.float64, n, elements=finite64)))


@settings(max_examples=60, deadline=None)
@given(vectors)
def test_a_run_judged_against_itself_passes(pair):
    truth, noise = pair
    x = (truth + 1e-3 * noise).astype(np.float32)
    assert numalign.judge({"x": x}, {"x": x}, {"x": truth}).aligned


@settings(max_examples=60, deadline=None)
@given(vectors, st.randoms(use_true_random=False))
def test_ratio_is_invariant_under_a_common_permutation(pair, rnd):
    truth, noise = pair
    ref = (truth + noise * 1e-2).astype(np.float32)
    test = (truth - noise * 3e-2).astype(np.float32)
    perm = np.array(rnd.sample(range(truth.size), truth.size))
    a = numalign.judge({"x": test}, {"x": ref}, {"x": truth})["x"]
    b = numalign.judge({"x": test[perm]}, {"x": ref[perm]}, {"x": truth[perm]})["x"]
    assert a["verdict"] == b["verdict"]
    if a["ratio"] is not None:
        assert np.isclose(a["ratio"], b["ratio"], rtol=1e-12, atol=0)


@settings(max_examples=60, deadline=None)
@given(vectors)
def test_rmse_is_symmetric(pair):
    a, b = pair
    ab, ba = compare.metrics(a, b)["rmse"], compare.metrics(b, a)["rmse"]
    assert np.isclose(ab, ba, rtol=1e-14, atol=0)
    assert np.isclose(ab, np.sqrt(np.mean((a - b) ** 2)), rtol=1e-12, atol=1e-300)


bf16_patterns = st.integers(0, 0xFFFF).filter(lambda b: (b & 0x7F80) != 0x7F80)  # finite only


def ulp(a, b):
    t = torch.tensor([a], dtype=torch.int32).to(torch.int16).view(torch.bfloat16)
    r = torch.tensor([b], dtype=torch.int32).to(torch.int16).view(torch.bfloat16)
    report = numalign.judge({"x": t}, {"x": r}, rules={"x": ("ulp:0", "measure only")})
    return report["x"]["max_ulp"]


@settings(max_examples=200, deadline=None)
@given(bf16_patterns, bf16_patterns, bf16_patterns)
def test_ulp_distance_is_a_metric_on_finite_values(a, b, c):
    a, b, c = (x - 0x10000 if x >= 0x8000 else x for x in (a, b, c))  # as int16 bit patterns
    dab, dba, dbc, dac = ulp(a, b), ulp(b, a), ulp(b, c), ulp(a, c)
    assert dab == dba
    assert dac <= dab + dbc
    assert (dab == 0) == (a == b or {a, b} == {0, -0x8000})  # only +0 / -0 coincide
