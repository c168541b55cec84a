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
    tensors, tags, _, _ = isolation._run_isolated(model, truth.calls, torch.float64, "cpu", mode)
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


# Where a call's truth cannot be taken from the run (found by a red team of the one-run
# truth): each must still equal the rerun.

def test_the_truth_of_one_run_where_hugging_face_collects_hidden_states():
    # HF's own forward hooks keep each layer's input (the view isolation handed the layer)
    # and return it as a hidden state: the upstream gradient then reaches the view from
    # outside the layer's call.
    _assert_the_same_truth(llama(), dict(hf_inputs(), output_hidden_states=True))
    seen = llama()
    with torch.no_grad():  # a user looked at the hidden states once: HF's hooks stay
        seen(**hf_inputs(), output_hidden_states=True)
    _assert_the_same_truth(seen, hf_inputs())
    _assert_the_same_truth(seen, dict(hf_inputs(), output_hidden_states=True))


class _ScaleGradient(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        return g * 1.01


def test_a_backward_bug_is_found_while_hugging_face_collects_hidden_states():
    ref, test = llama(), llama()

    class Buggy(type(test.model.layers[0])):
        def forward(self, hidden_states, *args, **kwargs):
            return super().forward(_ScaleGradient.apply(hidden_states), *args, **kwargs)

    test.model.layers[0].__class__ = Buggy
    report = isolate(test, ref, dict(hf_inputs(), output_hidden_states=True), torch.float32,
                     modules="model.layers.*")
    by_module = {e["module"]: e for e in report.ranking}
    assert not by_module["model.layers.0"]["aligned"]
    assert report.ranking[0]["module"] == "model.layers.0"


class _Clipped(torch.nn.Linear):
    """Clips its own weight in place as it runs (a WGAN critic's habit)."""

    def forward(self, x):
        with torch.no_grad():
            self.weight.clamp_(-0.3, 0.3)
        return super().forward(x)


class _Stack(torch.nn.Module):
    def __init__(self, *layers):
        super().__init__()
        torch.manual_seed(0)
        self.layers = torch.nn.ModuleList(layers)

    def forward(self, x):
        for layer in self.layers:
            x = torch.tanh(layer(x))
        return x


def test_the_truth_of_one_run_where_a_call_changes_its_parameters_in_place():
    ids = torch.tensor([[1, 2, 3, 2]])
    torch.manual_seed(0)
    _assert_the_same_truth(_Stack(torch.nn.Embedding(10, 4, max_norm=1.0), torch.nn.Linear(4, 1)),
                           (ids,))
    torch.manual_seed(0)
    _assert_the_same_truth(_Stack(torch.nn.Linear(4, 4), _Clipped(4, 4), torch.nn.Linear(4, 1)),
                           (torch.randn(3, 4, generator=torch.Generator().manual_seed(6)),))


class _Partial(torch.nn.Module):
    """Holds a reference to its weight outside ``_parameters``."""

    def __init__(self):
        super().__init__()
        import functools
        self.weight = torch.nn.Parameter(torch.randn(4, 4))
        self.project = functools.partial(torch.nn.functional.linear, weight=self.weight)

    def forward(self, x):
        return self.project(x)


class _WithHelper(torch.nn.Module):
    """Calls a module it does not own, whose weight is tied to its own layer's."""

    def __init__(self, helper):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)
        self.lin.weight = helper.weight
        object.__setattr__(self, "helper", helper)

    def forward(self, x):
        return self.lin(x) + self.helper(x)


class _Tied(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.helper = torch.nn.Linear(4, 4)
        self.outer = _WithHelper(self.helper)

    def forward(self, x):
        return self.outer(x)


def test_the_truth_of_one_run_where_weights_are_read_outside_the_parameters():
    x = torch.randn(3, 4, generator=torch.Generator().manual_seed(7))
    torch.manual_seed(0)
    _assert_the_same_truth(_Stack(torch.nn.utils.spectral_norm(torch.nn.Linear(4, 4)),
                                  torch.nn.Linear(4, 1)).eval(), (x,))
    torch.manual_seed(0)
    _assert_the_same_truth(_Stack(_Partial(), torch.nn.Linear(4, 1)), (x,))
    _assert_the_same_truth(_Tied(), (x,))
    doubled = _Stack(torch.nn.Linear(4, 4), torch.nn.Linear(4, 1))
    doubled.layers[0].register_forward_pre_hook(lambda module, args: (args[0] * 2,))
    _assert_the_same_truth(doubled, (x,))


class _Stashing(torch.nn.Module):
    """Keeps an auxiliary loss on itself, which the model returns (as MoE routers do)."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x):
        y = torch.tanh(self.lin(x))
        self.aux = (y ** 2).mean()
        return y


class _AuxLoss(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.a = _Stashing()
        self.b = torch.nn.Linear(4, 2)

    def forward(self, x):
        return self.b(self.a(x)), self.a.aux


class _Energy(torch.nn.Module):
    """Returns an energy and its forces, -dE/dx, taken inside forward (force fields)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.l1 = torch.nn.Linear(3, 8)
        self.act = torch.nn.Tanh()
        self.l2 = torch.nn.Linear(8, 1)

    def forward(self, pos):
        energy = self.l2(self.act(self.l1(pos))).sum()
        return energy, -torch.autograd.grad(energy, pos, create_graph=True)[0]


class _Forces(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.energy = _Energy()

    def forward(self, pos):
        return self.energy(pos)


def test_the_truth_of_one_run_where_gradients_go_around_a_call():
    x = torch.randn(3, 4, generator=torch.Generator().manual_seed(8))
    _assert_the_same_truth(_AuxLoss(), (x,))
    _assert_the_same_truth(_Forces(), (torch.randn(5, 3, generator=torch.Generator().manual_seed(9)),))


class _Checkpointed(torch.nn.Module):
    def __init__(self, reentrant):
        super().__init__()
        torch.manual_seed(0)
        self.block = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Tanh(), torch.nn.Linear(4, 4))
        self.out = torch.nn.Linear(4, 2)
        self.reentrant = reentrant

    def forward(self, x):
        from torch.utils.checkpoint import checkpoint
        return self.out(checkpoint(self.block, x, use_reentrant=self.reentrant))


def test_the_truth_of_one_run_under_activation_checkpointing():
    x = torch.randn(3, 4, generator=torch.Generator().manual_seed(10))
    for reentrant in (False, True):
        truth = _assert_the_same_truth(_Checkpointed(reentrant), (x,))
        assert truth.open_calls == [], "every call's parameters put back, none left open"


def test_the_truth_rerun_for_an_input_below_float64_is_not_reported_below_float64():
    x = torch.randn(3, 4, generator=torch.Generator().manual_seed(5))
    report = isolate(_Upcast(), _Upcast(), (x,), torch.bfloat16, float64_truth="watch")
    below = [w for w in report.warnings if w.startswith("the truth computed in less")]
    # The child's truth was rerun in float64; the model's own code is no module's truth.
    assert not any("child" in w or "(model)" in w for w in below), below
