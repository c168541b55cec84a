"""test_isolation.py: capture.isolate judges each module on the float64 truth's inputs to
it, so a module is ranked by its own error, not by what it inherited."""
import sys
from pathlib import Path

import torch

import numalign
from numalign.capture import isolate, trace_model

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples" / "transformer"))
import model as transformer  # noqa: E402


def test_transformer_isolation_ranks_the_buggy_mlp_first():
    reference, test = transformer.make_models()
    report = isolate(test, reference, (transformer.make_input(),), torch.bfloat16)
    assert not report.aligned
    top = report.ranking[0]
    assert top["module"] == "layers.1.mlp" and not top["aligned"]
    assert top["ratio"] > top["limit"]
    # No module of layer 0 and no norm is wrong by itself.
    by_module = {e["module"]: e for e in report.ranking}
    assert all(e["aligned"] for m, e in by_module.items() if m.startswith("layers.0"))
    assert by_module["norm"]["aligned"]
    text = str(report)
    assert text.startswith("modules in isolation")
    assert text.splitlines()[1].split()[2] == "layers.1.mlp"
    assert report.first_divergence is None, "no module sees another's output here"


class _DropColumn(torch.nn.Module):
    """A linear layer that forgets the last column of its reduction when `bug` is set."""

    def __init__(self, bug):
        super().__init__()
        self.bug = bug
        self.weight = torch.nn.Parameter(torch.randn(16, 16) / 4)

    def forward(self, x):
        if self.bug:
            return x[..., :-1] @ self.weight[:-1]
        return x @ self.weight


class _Pair(torch.nn.Module):
    def __init__(self, bug):
        super().__init__()
        torch.manual_seed(0)
        self.first = _DropColumn(bug)
        self.second = _DropColumn(False)

    def forward(self, x):
        return self.second(torch.tanh(self.first(x)))


def test_isolation_clears_a_module_that_only_inherits_the_error():
    x = torch.randn(8, 16, generator=torch.Generator().manual_seed(2))
    whole = numalign.judge(trace_model(_Pair(True), (x,), torch.float32),
                           trace_model(_Pair(False), (x,), torch.float32),
                           trace_model(_Pair(False), (x,), torch.float64))
    assert whole["second.out"]["verdict"] == "fail", "downstream of the bug, in the whole run"
    isolated = isolate(_Pair(True), _Pair(False), (x,), torch.float32)
    assert isolated["first.out"]["verdict"] == "fail"
    assert isolated["second.out"]["verdict"] == "pass"
    assert isolated["second.grad"]["verdict"] == "pass"
    assert [e["module"] for e in isolated.ranking][0] == "first"


def test_each_call_of_a_shared_module_is_isolated():
    class Twice(torch.nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.lin = torch.nn.Linear(8, 8)

        def forward(self, x):
            return self.lin(torch.relu(self.lin(x)))

    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(3))
    report = isolate(Twice(), Twice(), (x,), torch.bfloat16)
    names = {t["name"] for t in report.tensors}
    assert {"lin.out", "lin#1.out", "lin.grad", "lin#1.grad", "lin#1.grad.param.weight"} <= names
    assert report.aligned


# The truth role of isolation is taken from the one float64 run that records every call's
# inputs, instead of rerunning each call on its own. The oracle: the rerun itself
# (_run_isolated, which the other roles still use), in float64, on the same recorded calls.

from numalign import isolation  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples" / "hf"))
from hf_models import bert, inputs as hf_inputs, llama  # noqa: E402


def _one_run_and_reruns(model, inputs, mode="keep"):
    truth = isolation._record_truth(model, inputs, None, "cpu", mode)
    tensors, tags, _ = isolation._run_isolated(model, truth.calls, torch.float64, "cpu", mode)
    return truth, tensors, tags


def _assert_the_same_truth(model, inputs, mode="keep"):
    truth, tensors, tags = _one_run_and_reruns(model, inputs, mode)
    assert list(truth.tensors) == list(tensors), "the same tensors, in the same order"
    assert truth.tags == tags
    for name, expected in tensors.items():
        got = truth.tensors[name]
        assert got.dtype == expected.dtype and got.shape == expected.shape, name
        if got.is_floating_point():  # float64 sums in another order: rounding apart
            torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-12, msg=name)
        else:
            assert torch.equal(got, expected), name
    return truth


class _Scaled(torch.nn.Module):
    """Takes a floating keyword input that needs no gradient (like rotary cos/sin or an
    additive mask), passes it to a module without parameters, and calls one module twice."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)
        self.act = torch.nn.Tanh()
        self.keep = torch.nn.Identity()

    def forward(self, x, *, scale):
        return self.keep(self.lin(torch.relu(self.lin(x))) * self.act(scale))


class _Box:
    """A result numalign cannot judge: a plain object holding a tensor."""

    def __init__(self, value):
        self.value = value


class _Boxed(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)

    def forward(self, x):
        return self.lin(x), _Box(torch.sin(self.lin.weight.sum(0) * x))


class _Toy(torch.nn.Module):
    """Tied weights (an embedding read out by its own matrix), a buffer-made input handed on
    as a keyword, one tensor passed twice, a module whose input is also its output, and one
    with a result numalign cannot judge."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.embed = torch.nn.Embedding(16, 8)
        self.block = _Scaled()
        self.pair = torch.nn.Bilinear(8, 8, 8)
        self.head = torch.nn.Linear(8, 16, bias=False)
        self.head.weight = self.embed.weight
        self.boxed = _Boxed()
        self.register_buffer("freq", torch.linspace(0.5, 1.5, 8))

    def forward(self, ids):
        h = self.embed(ids)
        h = self.block(h, scale=torch.cos(self.freq * ids.unsqueeze(-1)))
        h, box = self.boxed(h)
        return self.head(self.pair(h, h + box.value))


def test_the_truth_of_one_run_is_each_call_rerun_on_its_own():
    ids = torch.randint(0, 16, (2, 5), generator=torch.Generator().manual_seed(4))
    truth = _assert_the_same_truth(_Toy(), (ids,))
    # The Tanh inside the block computes only from the block's `scale`, which needs no
    # gradient in the model: it is rerun, not taken from the run (a gradient there would
    # only exist because the block's input was made a leaf).
    # The second result of `boxed` is not a value the trace holds, yet the model computes
    # on it: the gradient it receives would reach the call, and no rerun gives it one.
    assert truth.rerun == ["block.act", "boxed"]
    names = set(truth.tensors)
    assert {"block.grad.1.scale", "pair.grad.0", "pair.grad.1", "embed.grad.param.weight",
            "head.grad.param.weight", "block.lin#1.grad.param.weight"} <= names
    assert "block.act.grad" not in names


def test_the_truth_of_one_run_on_the_examples_transformer():
    reference, _ = transformer.make_models()
    truth = _assert_the_same_truth(reference, (transformer.make_input(),))
    assert truth.rerun == []


def test_the_truth_of_one_run_on_hf_models_called_as_users_call_them():
    for make in (llama, bert):
        truth = _assert_the_same_truth(make(), hf_inputs())
        assert truth.rerun == [], make.__name__
    _assert_the_same_truth(llama(), hf_inputs(), mode="watch")


class _Child(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.linspace(-1.0, 1.0, 4))

    def forward(self, x):
        return torch.tanh(x * self.weight.to(x.dtype))


class _Upcast(torch.nn.Module):
    """Hands its child a float32 tensor: in the truth's "watch" mode the child's input is
    not float64 in the run, and a rerun casts it to float64, so it is rerun."""

    def __init__(self):
        super().__init__()
        self.child = _Child()

    def forward(self, x):
        return self.child(x.float()).to(x.dtype)


def test_a_call_given_less_than_float64_in_the_run_is_rerun():
    x = torch.randn(3, 4, generator=torch.Generator().manual_seed(5))
    truth = _assert_the_same_truth(_Upcast(), (x,), mode="watch")
    assert truth.rerun == ["child"]
    assert _assert_the_same_truth(_Upcast(), (x,), mode="keep").rerun == []
