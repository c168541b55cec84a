"""test_isolation.py: capture.isolate judges each module on the float64 truth's inputs to
it, so a module is ranked by its own error, not by what it inherited."""
import sys
from pathlib import Path

import pytest
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


def test_a_module_that_cannot_run_on_its_own_is_named():
    class InPlace(torch.nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.lin = torch.nn.Linear(4, 4)
            self.act = torch.nn.ReLU(inplace=True)  # changes its own input: a leaf, run alone

        def forward(self, x):
            return self.act(self.lin(x))

    x = torch.randn(3, 4, generator=torch.Generator().manual_seed(11))
    with pytest.raises(RuntimeError, match=r"'act' \(ReLU\).*on its own.*modules=") as caught:
        isolate(InPlace(), InPlace(), (x,), torch.bfloat16)
    assert "in-place" in str(caught.value), "torch's own reason is kept"
    assert isolate(InPlace(), InPlace(), (x,), torch.bfloat16, modules="lin").aligned
