"""test_truth_values.py: the float64 truth computes on the values the runs hold (their inputs,
parameters and upstream gradient rounded to the runs' dtype, widened exactly), so the rounding
ref and test share is no part of the allowance; a truth made otherwise is warned about."""
import pytest
import torch

import numalign
from numalign import capture

BF16 = torch.bfloat16


class LowAccumulatorLinear(torch.nn.Linear):
    """A linear layer whose running sum is stored in the run's dtype between tiles of 32 inputs
    (a low-precision accumulator, the bug of pytorch#189581 and cutlass#1188)."""

    def forward(self, x):
        out = torch.zeros(x.shape[:-1] + (self.out_features,), dtype=x.dtype)
        for s in range(0, self.in_features, 32):
            part = x[..., s:s + 32].float() @ self.weight[:, s:s + 32].float().T
            out = (out.float() + part).to(x.dtype)
        return out + self.bias


def _models():
    torch.manual_seed(0)
    ref = torch.nn.Linear(1024, 64)
    test = LowAccumulatorLinear(1024, 64)
    test.load_state_dict(ref.state_dict())
    return ref, test, torch.randn(32, 1024)


def test_a_bug_hidden_by_the_shared_input_rounding_is_seen():
    ref_model, test_model, x = _models()
    ref = capture.run_fwd_bwd(ref_model, (x,), BF16)
    test = capture.run_fwd_bwd(test_model, (x,), BF16)
    unrounded = capture.run_fwd_bwd(ref_model, (x,), torch.float64)
    truth = capture.run_fwd_bwd(ref_model, (x,), torch.float64, truth_of=BF16)
    assert truth.metadata["truth_of"] == "bfloat16"
    # Under same()'s rule (RMSE alone) the truth decides whether the bug is seen; the default
    # rule sees it either way (its worst element), with a larger ratio on the runs' values.
    seen = numalign.judge(test, ref, truth, rules="same")
    assert not seen.aligned and seen["out"]["verdict"] == "fail"
    assert not any("never held" in w for w in seen.warnings)
    # The truth on unrounded values passes the same bug (ratio under 3), and says why not to
    # trust that.
    hidden = numalign.judge(test, ref, unrounded, rules="same")
    assert hidden["out"]["verdict"] == "pass" and hidden["out"]["ratio"] < seen["out"]["ratio"]
    assert any("never held" in w and "truth_of" in w for w in hidden.warnings)
    default_seen, default_hidden = numalign.judge(test, ref, truth), numalign.judge(test, ref, unrounded)
    assert default_seen["out"]["verdict"] == "fail" and default_hidden["out"]["verdict"] == "fail"
    assert default_hidden["out"]["ratio"] < default_seen["out"]["ratio"]


class PassThrough(torch.nn.Module):
    """out = x * w: the truth's output and input gradient show exactly what it computed on."""

    def __init__(self, n):
        super().__init__()
        self.w = torch.nn.Parameter(torch.linspace(0.1, 3.3, n, dtype=torch.float32) / 3)

    def forward(self, x):
        return x * self.w


def test_the_truth_holds_the_runs_inputs_parameters_and_upstream_gradient():
    model = PassThrough(300)
    x = torch.randn(4, 300, generator=torch.Generator().manual_seed(3))
    truth = capture.run_fwd_bwd(model, (x,), torch.float64, truth_of=BF16)
    xr, wr = x.to(BF16).double(), model.w.detach().to(BF16).double()
    assert torch.equal(truth["out"], xr * wr)  # products of two bf16 values are exact in f64
    # x * 1 passes the upstream gradient through unchanged: the truth's is every run's, and
    # the runs' are the same whatever their dtype (values on a grid of 1/128, with 8 bits)
    identity = capture.run_fwd_bwd(Identity(), (x,), torch.float64, truth_of=BF16)
    for dtype in (BF16, torch.float16, torch.float32):
        run = capture.run_fwd_bwd(Identity(), (x,), dtype)
        assert torch.equal(identity["grad.input.0"], run["grad.input.0"].double())
    assert torch.equal(identity["grad.input.0"] * 128, (identity["grad.input.0"] * 128).round())


class Identity(torch.nn.Module):
    def forward(self, x):
        return x * 1


def test_truth_of_is_for_a_float64_run_and_a_floating_dtype():
    model, x = PassThrough(8), torch.randn(2, 8)
    with pytest.raises(ValueError, match="not a float32 run"):
        capture.run_fwd_bwd(model, (x,), torch.float32, truth_of=BF16)
    same = capture.run_fwd_bwd(model, (x,), BF16, truth_of=BF16)  # a run of the dtype: as is
    plain = capture.run_fwd_bwd(model, (x,), BF16)
    assert all(torch.equal(same[n], plain[n]) for n in plain.metadata["order"])
    assert "truth_of" not in same.metadata
    with pytest.raises(ValueError, match="floating dtype"):
        capture.trace_model(model, (x,), torch.float64, truth_of=torch.int32)


def test_a_truth_for_another_dtype_is_warned_about():
    ref_model, test_model, x = _models()
    ref = capture.run_fwd_bwd(ref_model, (x,), BF16)
    truth = capture.run_fwd_bwd(ref_model, (x,), torch.float64, truth_of=torch.float16)
    report = numalign.judge(ref, ref, truth)
    assert any("rounded to 'float16', but ref ran 'bfloat16'" in w for w in report.warnings)


def test_trace_model_and_isolate_judge_on_the_runs_values():
    ref_model, test_model, x = _models()
    ref_seq, test_seq = torch.nn.Sequential(ref_model), torch.nn.Sequential(test_model)
    truth = capture.trace_model(ref_seq, (x,), torch.float64, truth_of=BF16)
    assert torch.equal(truth["0.in"], x.to(BF16).double())
    report = numalign.judge(capture.trace_model(test_seq, (x,), BF16),
                            capture.trace_model(ref_seq, (x,), BF16), truth)
    assert report["0.out"]["verdict"] == "fail"
    isolated = capture.isolate(test_seq, ref_seq, (x,), BF16)
    assert isolated.ranking[0]["module"] == "0" and not isolated.aligned
