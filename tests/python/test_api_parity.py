"""test_api_parity.py: numalign.judge's verdict under the same rule equals
torch._dynamo.utils.same()'s, case for case, on generated cases around the boundary for every multiplier branch, tol and option."""
import pytest
import torch
from torch._dynamo.utils import same

import numalign

SHAPES = [(6,), (10,), (250,), (500,), (999,), (1200,), (2, 300, 1, 1), (4, 8, 40)]
DTYPES = [torch.float16, torch.bfloat16, torch.float32]
TOLS = [1e-4, 1e-3, 2e-2, 4e-2]
OPTIONS = [{}, {"use_larger_multiplier_for_smaller_tensor": True}, {"force_max_multiplier": True},
           {"equal_nan": True}]


def generate(seed):
    """Cases across shapes and dtypes; the test error is 0.3x to 12x the reference's, with
    some within tol of ref (fast path) and some with NaN in ref, test or truth."""
    g = torch.Generator().manual_seed(seed)
    cases = {}
    i = 0
    for dtype in DTYPES:
        for shape in SHAPES:
            for k in range(3):
                truth = torch.randn(shape, dtype=torch.float64, generator=g)
                noise = 10 ** float(torch.empty(1).uniform_(-5, -1, generator=g))
                ref = (truth + noise * torch.randn(shape, dtype=torch.float64, generator=g)).to(dtype)
                factor = float(torch.empty(1).uniform_(0.3, 12.0, generator=g))
                test = (truth + factor * noise * torch.randn(shape, dtype=torch.float64, generator=g)).to(dtype)
                if k == 2 and i % 2:
                    test = ref.double().add(3e-5 * torch.randn(shape, dtype=torch.float64, generator=g)).to(dtype)
                if i % 11 == 5:
                    ref.view(-1)[1] = float("nan")
                if i % 13 == 7:
                    test.view(-1)[0] = float("nan")
                    ref.view(-1)[0] = float("nan")
                cases[f"c{i:03d}"] = (test, ref, truth)
                i += 1
    return cases


KW = {"use_larger_multiplier_for_smaller_tensor": "larger_multiplier_for_small",
      "force_max_multiplier": "force_max_multiplier", "equal_nan": "equal_nan"}


@pytest.mark.parametrize("tol", TOLS)
@pytest.mark.parametrize("options", OPTIONS, ids=["plain", "larger-small", "force-max", "equal-nan"])
def test_verdicts_equal_same(tol, options):
    cases = generate(seed=int(tol * 1e5) + len(options))
    report = numalign.judge({n: c[0] for n, c in cases.items()}, {n: c[1] for n, c in cases.items()},
                            {n: c[2] for n, c in cases.items()}, tol=tol, rules=["same"],
                            **{KW[k]: v for k, v in options.items()})
    verdicts = {t["name"]: t["verdict"] for t in report.tensors}
    both = set()
    for name, (test, ref, truth) in cases.items():
        expected = same(ref, test, fp64_ref=truth, tol=tol, log_error=lambda *a: None, **options)
        assert verdicts[name] in ("pass", "fail"), report[name]
        assert (verdicts[name] == "pass") == expected, (name, test.dtype, tuple(test.shape), report[name]["reason"])
        both.add(expected)
    assert both == {True, False}, "the generated cases must straddle the boundary"


def test_case_count_covers_the_spec():
    assert len(generate(0)) * len(TOLS) * len(OPTIONS) >= 500
