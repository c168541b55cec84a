"""test_trace_ops.py: op-level drill-down (capture.trace_ops): each ATen op's outputs inside
the selected modules, forward and backward, named by module call and place in its op
sequence, with what each was computed from; the judge names the first op that fails while
its inputs pass, pairs runs of the same code op by op, and where two implementations' op
sequences differ says where they stop matching instead of judging one op against another."""
import json
import sys
import warnings
from pathlib import Path

import pytest
import torch

import numalign
from numalign.capture import trace_model, trace_ops

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "examples" / "hf"))
from hf_models import inputs as hf_inputs  # noqa: E402
from hf_models import llama  # noqa: E402


@torch.library.custom_op("numalign_test::matmul", mutates_args=())
def matmul(x: torch.Tensor, w: torch.Tensor, accumulate: str) -> torch.Tensor:
    """x @ w.T, a kernel as a custom op. accumulate="bf16": the running sum is rounded to
    bf16 after each product, as a kernel that accumulates in bf16 does."""
    if accumulate == "bf16" and x.dtype == torch.bfloat16:
        acc = torch.zeros(x.shape[0], w.shape[0], dtype=torch.bfloat16)
        for k in range(x.shape[1]):
            acc = (acc.float() + x[:, k:k + 1].float() * w[:, k].float()).to(torch.bfloat16)
        return acc
    return x @ w.T


@matmul.register_fake
def _(x, w, accumulate):
    return x.new_empty(x.shape[0], w.shape[0])


def _setup(ctx, inputs, output):
    ctx.save_for_backward(inputs[0], inputs[1])
    ctx.accumulate = inputs[2]


def _backward(ctx, grad):
    """The input's gradient by the same kernel (in bf16 for accumulate="bf16-backward")."""
    x, w = ctx.saved_tensors
    accumulate = "bf16" if ctx.accumulate == "bf16-backward" else "fp32"
    return matmul(grad, w.t(), accumulate), grad.T @ x, None


matmul.register_autograd(_backward, setup_context=_setup)


class KernelMLP(torch.nn.Module):
    def __init__(self, accumulate=("fp32", "fp32"), d=32, hidden=1024):
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.up = torch.nn.Parameter(torch.randn(hidden, d, generator=g) / d ** 0.5)
        self.down = torch.nn.Parameter(torch.randn(d, hidden, generator=g) / hidden ** 0.5)
        self.accumulate = accumulate

    def forward(self, x):
        h = torch.nn.functional.gelu(matmul(x, self.up, self.accumulate[0]))
        return matmul(h, self.down, self.accumulate[1])


class Residual(torch.nn.Module):
    def __init__(self, mlp):
        super().__init__()
        self.norm = torch.nn.LayerNorm(mlp.up.shape[1])
        self.mlp = mlp

    def forward(self, x):
        return x + self.mlp(self.norm(x))


class Block(torch.nn.Module):
    """Linear, ReLU, Linear: forward addmm, relu, addmm."""

    def __init__(self, d=8):
        super().__init__()
        torch.manual_seed(0)
        self.fc1, self.fc2 = torch.nn.Linear(d, 2 * d), torch.nn.Linear(2 * d, d)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


class Model(torch.nn.Module):
    def __init__(self, block=None):
        super().__init__()
        self.block = block or Block()

    def forward(self, x):
        return self.block(x) * 2


def x_input(rows=4, d=8):
    return torch.randn(rows, d, generator=torch.Generator().manual_seed(1))


def ops_of(trace, kind=None):
    tags = trace.metadata["tags"]
    return [n for n in trace.metadata["order"]
            if "op" in tags[n] and (kind is None or tags[n]["kind"] == kind)]


def test_ops_are_named_by_module_call_and_place_forward_and_backward():
    t = trace_ops(Model(), (x_input(),), torch.float32, modules=["block"])
    tags, order = t.metadata["tags"], t.metadata["order"]
    assert ops_of(t, "op") == ["block/aten.addmm#0", "block/aten.relu#1", "block/aten.addmm#2"]
    for n in ops_of(t, "op"):
        assert tags[n] == {"module": "block", "kind": "op", "call": "0",
                           "op": n.split("/")[1].split("#")[0]}
    backward = ops_of(t, "op-grad")
    assert backward and all(n.startswith("block/grad/aten.") for n in backward)
    assert [n.rpartition("#")[2] for n in backward] == [str(k) for k in range(len(backward))]
    assert {tags[n]["kind"] for n in backward} == {"op-grad"}
    # In execution order: the module's input, its ops, its output; backward, the gradient it
    # received, its ops' gradients, the gradient it passed upstream.
    at = {n: i for i, n in enumerate(order)}
    assert at["block.in"] < at["block/aten.addmm#0"] < at["block/aten.addmm#2"] < at["block.out"]
    assert at["block.grad_out"] < at[backward[0]] and at[backward[-1]] < at["block.grad"]
    # Views (t), detaches and the model's own code outside the module are not recorded.
    assert not any("aten.t#" in n or "detach" in n for n in order)
    assert not any(n.startswith("/") or "aten.mul" in n for n in ops_of(t))
    # Values: the op's result as computed (relu of the first addmm).
    assert torch.equal(t["block/aten.relu#1"], torch.relu(t["block/aten.addmm#0"]))


def test_each_op_lists_the_recorded_tensors_it_was_computed_from():
    t = trace_ops(Model(), (x_input(),), torch.float32, modules=["block"])
    inputs = t.metadata["inputs"]
    assert inputs["block/aten.addmm#0"] == ["block.in"]  # weights and bias: parameters
    assert inputs["block/aten.relu#1"] == ["block/aten.addmm#0"]
    assert inputs["block/aten.addmm#2"] == ["block/aten.relu#1"]
    backward = ops_of(t, "op-grad")
    assert inputs[backward[0]] == ["block.grad_out"]
    # A parameter's gradient is the result of the op that computed it.
    assert inputs["grad.param.block.fc2.weight"] == ["block/grad/aten.mm#1"]
    assert inputs["grad.param.block.fc1.bias"] == ["block/grad/aten.sum#6"]
    recorded = set(t.metadata["order"])
    for n in backward:
        assert inputs[n] and set(inputs[n]) <= recorded, (n, inputs[n])
    # relu's backward reads what relu produced, and a gradient computed before it.
    threshold = [n for n in backward if "threshold_backward" in n]
    assert len(threshold) == 1
    assert "block/aten.relu#1" in inputs[threshold[0]]
    assert any(i in backward for i in inputs[threshold[0]])


def test_a_parameter_used_twice_has_the_sum_of_its_two_gradients_as_its_gradient():
    class Shared(torch.nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.fc = torch.nn.Linear(8, 8)

        def forward(self, x):
            return self.fc(torch.relu(self.fc(x)))

    t = trace_ops(Model(Shared()), (x_input(),), torch.float32, modules=["block"])
    inputs = t.metadata["inputs"]
    # Autograd sums the two uses' gradients while the node of the second is current: the sum
    # is the module's op, and the parameter's gradient is its result.
    total = inputs["grad.param.block.fc.weight"]
    assert len(total) == 1 and t.metadata["tags"][total[0]]["op"] == "aten.add"
    assert sorted(inputs[total[0]]) == ["block/grad/aten.mm#1", "block/grad/aten.mm#5"]
    single = trace_ops(Model(), (x_input(),), torch.float32, modules=["block"])
    assert single.metadata["inputs"]["grad.param.block.fc2.weight"] == ["block/grad/aten.mm#1"]


def test_nested_modules_own_their_ops_and_a_second_call_gets_its_index():
    class Twice(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = Block()

        def forward(self, x):
            return torch.tanh(self.inner(self.inner(x)))

    t = trace_ops(Model(Twice()), (x_input(),), torch.float32, modules=["block", "block.inner"])
    fwd = ops_of(t, "op")
    assert fwd == ["block.inner/aten.addmm#0", "block.inner/aten.relu#1",
                   "block.inner/aten.addmm#2", "block.inner#1/aten.addmm#0",
                   "block.inner#1/aten.relu#1", "block.inner#1/aten.addmm#2", "block/aten.tanh#0"]
    inputs = t.metadata["inputs"]
    assert inputs["block.inner#1/aten.addmm#0"] == ["block.inner#1.in"]
    assert inputs["block/aten.tanh#0"] == ["block.inner#1.out"]
    bwd = ops_of(t, "op-grad")
    assert bwd[0] == "block/grad/aten.tanh_backward#0"
    assert any(n.startswith("block.inner#1/grad/") for n in bwd)
    assert any(n.startswith("block.inner/grad/") for n in bwd)
    first_inner = min(i for i, n in enumerate(bwd) if n.startswith("block.inner/grad/"))
    assert all(not n.startswith("block.inner/grad/") for n in bwd[:first_inner])
    assert max(i for i, n in enumerate(bwd) if n.startswith("block.inner#1/grad/")) < first_inner


class CastingNorm(torch.nn.Module):
    """As Hugging Face's RMSNorm: computes in float32 whatever its input, casts back."""

    def __init__(self, d):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.linspace(0.5, 1.5, d))

    def forward(self, x):
        dtype = x.dtype
        h = x.to(torch.float32)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)
        return self.weight * h.to(dtype)


class NormThenBlock(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.norm, self.block = CastingNorm(8), Block()

    def forward(self, x):
        return self.block(self.norm(x))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_runs_of_the_same_code_pair_op_by_op_with_their_float64_truth(dtype):
    model, x = NormThenBlock(), (x_input(),)
    runs = [trace_ops(model, x, d, modules=["norm", "block"])
            for d in (dtype, dtype, torch.float64)]
    truth = runs[2]
    # Casts (x.to(float32) and back) are not recorded: the truth, kept float64, skips some.
    assert truth.metadata["order"] == runs[0].metadata["order"]
    assert "norm/aten.rsqrt#3" in ops_of(truth, "op")
    assert truth.metadata["below_float64"] == {}
    report = numalign.judge(*runs)
    assert report.aligned, str(report)
    assert not any("stop matching" in w for w in report.warnings)
    assert report.summary["tensors"] >= len(ops_of(truth)) > 10


def planted():
    x = (torch.randn(16, 32, generator=torch.Generator().manual_seed(2)),)
    ref = Residual(KernelMLP())
    test = Residual(KernelMLP(accumulate=("fp32", "bf16")))
    test.load_state_dict(ref.state_dict())
    runs = [trace_ops(m, x, d, modules=["mlp"])
            for m, d in ((test, torch.bfloat16), (ref, torch.bfloat16), (ref, torch.float64))]
    return runs


def test_the_one_matmul_that_accumulates_in_bf16_is_named_not_its_neighbours():
    test, ref, truth = planted()
    assert ops_of(ref, "op") == ["mlp/numalign_test.matmul#0", "mlp/aten.gelu#1",
                                 "mlp/numalign_test.matmul#2"]
    report = numalign.judge(test, ref, truth)
    verdict = {r["name"]: r["verdict"] for r in report.tensors}
    assert verdict["mlp/numalign_test.matmul#2"] == "fail"
    assert verdict["mlp/numalign_test.matmul#0"] == verdict["mlp/aten.gelu#1"] == "pass"
    assert verdict["mlp.in"] == "pass"
    forward = report.first_divergence["forward"]
    assert forward == {"tensor": "mlp/numalign_test.matmul#2", "module": "mlp",
                       "op": "numalign_test.matmul", "inputs_aligned": True,
                       "failing_inputs": []}
    assert ("first divergence, forward: mlp/numalign_test.matmul#2 (module mlp, op "
            "numalign_test.matmul): its inputs pass, so this op is the culprit") in str(report)
    # The same runs recorded by module say no more than "the MLP".
    x = (torch.randn(16, 32, generator=torch.Generator().manual_seed(2)),)
    coarse = numalign.judge(*[trace_model(m, x, d, modules=["mlp"]) for m, d in (
        (Residual(KernelMLP(accumulate=("fp32", "bf16"))), torch.bfloat16),
        (Residual(KernelMLP()), torch.bfloat16), (Residual(KernelMLP()), torch.float64))])
    assert coarse.first_divergence["forward"]["tensor"] == "mlp.out"


def test_a_kernel_wrong_only_in_backward_is_named_in_the_backward_pass():
    x = (torch.randn(16, 32, generator=torch.Generator().manual_seed(2)),)
    test, ref, truth = [trace_ops(Residual(KernelMLP(accumulate=acc)), x, d, modules=["mlp"])
                        for acc, d in ((("bf16-backward", "fp32"), torch.bfloat16),
                                       (("fp32", "fp32"), torch.bfloat16),
                                       (("fp32", "fp32"), torch.float64))]
    kernels = [n for n in ops_of(ref, "op-grad") if "numalign_test.matmul" in n]
    assert len(kernels) == 2  # the input gradients of matmul #2, then of matmul #0
    report = numalign.judge(test, ref, truth)
    assert report.first_divergence["forward"] is None
    backward = report.first_divergence["backward"]
    assert backward["tensor"] == kernels[1], str(report)
    assert backward["op"] == "numalign_test.matmul" and backward["inputs_aligned"] is True
    assert report[kernels[0]]["verdict"] == "pass"
    assert report["mlp.grad"]["verdict"] == "fail"  # inherited from the op


def test_op_traces_streamed_to_files_judge_the_same_in_the_cli(tmp_path, cli):
    x = (torch.randn(16, 32, generator=torch.Generator().manual_seed(2)),)
    paths = []
    for role, acc, d in (("test", ("fp32", "bf16"), torch.bfloat16),
                         ("ref", ("fp32", "fp32"), torch.bfloat16),
                         ("truth", ("fp32", "fp32"), torch.float64)):
        paths.append(tmp_path / f"{role}.safetensors")
        trace_ops(Residual(KernelMLP(accumulate=acc)), x, d, modules=["mlp"], save_to=paths[-1])
    proc = cli("judge", *paths)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert ("first divergence, forward: mlp/numalign_test.matmul#2 (module mlp, op "
            "numalign_test.matmul): its inputs pass, so this op is the culprit") in proc.stdout
    proc = cli("judge", *paths, "--format", "json")
    forward = json.loads(proc.stdout)["first_divergence"]["forward"]
    assert forward["op"] == "numalign_test.matmul" and forward["inputs_aligned"] is True


class MmThenAdd(torch.nn.Module):
    """The same linear layer as Block's fc1 + relu, written as mm then add."""

    def __init__(self, block):
        super().__init__()
        self.fc1, self.fc2 = block.fc1, block.fc2

    def forward(self, x):
        h = torch.relu(torch.mm(x, self.fc1.weight.t()) + self.fc1.bias)
        return self.fc2(h)


def test_where_two_implementations_run_other_ops_the_report_says_where_they_stop_matching():
    ref_model = Model()
    test_model = Model(MmThenAdd(ref_model.block))
    x = (x_input(),)
    test = trace_ops(test_model, x, torch.float32, modules=["block"])
    ref, truth = (trace_ops(ref_model, x, d, modules=["block"])
                  for d in (torch.float32, torch.float64))
    assert ops_of(test, "op")[:3] == ["block/aten.mm#0", "block/aten.add#1", "block/aten.relu#2"]
    report = numalign.judge(test, ref, truth)
    assert ("op sequences of block stop matching at #0: ref aten.addmm, test aten.mm; the 3 ops "
            "of ref from there on are not paired (could not judge)") in report.warnings
    # Backward, the two run the same ops until the weight gradients of fc1.
    assert ("op sequences of block/grad stop matching at #4: ref aten.mm, test aten.sum; the 3 "
            "ops of ref from there on are not paired (could not judge)") in report.warnings
    unpaired = {r["name"]: r["reason"] for r in report.tensors if r["verdict"] == "error"}
    forward = "not paired: op sequences of block stop matching at #0: ref aten.addmm, test aten.mm"
    backward = ("not paired: op sequences of block/grad stop matching at #4: ref aten.mm, "
                "test aten.sum")
    assert unpaired == {**{n: forward for n in ops_of(ref, "op")},
                        **{n: backward for n in ops_of(ref, "op-grad")[4:]}}
    for n in ops_of(ref, "op-grad")[:4]:  # before the mismatch: judged, and they pass
        assert report[n]["verdict"] == "pass", n
    # Both computed the same thing: the module's own tensors pass, but the ops that could not
    # be paired are never passed.
    assert report["block.out"]["verdict"] == "pass"
    assert not report.aligned and report.exit_code == 2
    assert report.first_divergence["forward"] is None
    assert "COULD NOT JUDGE" in str(report)


def test_streamed_to_a_file_it_is_the_same_trace(tmp_path):
    model, x = Model(), (x_input(),)
    held = trace_ops(model, x, torch.float32, modules=["block"])
    path = tmp_path / "ops.safetensors"
    streamed = trace_ops(model, x, torch.float32, modules=["block"], save_to=path)
    assert streamed.metadata == held.metadata
    loaded = numalign.Trace.load(path)
    assert list(loaded.metadata["order"]) == list(held.metadata["order"])
    for n in held.metadata["order"]:
        assert torch.equal(torch.as_tensor(loaded[n]), torch.as_tensor(held[n])), n
    with pytest.raises(numalign.capture.RecordingBudgetExceeded):
        trace_ops(model, x, torch.float32, modules=["block"], memory_budget=64)


def test_modules_are_required_and_must_match():
    with pytest.raises(TypeError):
        trace_ops(Model(), (x_input(),), torch.float32)  # modules= is keyword-only, required
    with pytest.raises(ValueError, match="needs modules"):
        trace_ops(Model(), (x_input(),), torch.float32, modules=[])
    with pytest.raises(ValueError, match="no submodule"):
        trace_ops(Model(), (x_input(),), torch.float32, modules=["nothing.*"])


def test_a_hugging_face_llama_mlp_op_by_op_with_keyword_inputs():
    model, ids = llama(), hf_inputs()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        runs = [trace_ops(model, ids, d, modules=["model.layers.0.mlp"])
                for d in (torch.bfloat16, torch.bfloat16, torch.float64)]
    assert [str(w.message) for w in caught] == []
    test, ref, truth = runs
    fwd = ops_of(ref, "op")
    assert fwd == ops_of(truth, "op") and ops_of(ref, "op-grad") == ops_of(truth, "op-grad")
    assert [n.split("/")[1].split("#")[0] for n in fwd] == [
        "aten.mm", "aten.silu", "aten.mm", "aten.mul", "aten.mm"]
    assert all(n.startswith("model.layers.0.mlp/") for n in fwd)
    assert len(ops_of(ref, "op-grad")) >= 6
    inputs = ref.metadata["inputs"]
    assert inputs["model.layers.0.mlp/aten.mm#0"] == ["model.layers.0.mlp.in"]
    assert inputs["model.layers.0.mlp/aten.mul#3"] == ["model.layers.0.mlp/aten.silu#1",
                                                      "model.layers.0.mlp/aten.mm#2"]
    report = numalign.judge(*runs)
    assert report.aligned, str(report)
    assert not any("stop matching" in w for w in report.warnings)


def test_a_whole_llama_layer_pairs_op_by_op_with_its_float64_truth():
    """Norms that cast to float32, rotary embeddings, the cache update, CPU flash attention:
    the bf16 runs and the float64 truth run the same ops."""
    model, ids = llama(), hf_inputs()
    runs = [trace_ops(model, ids, d, modules=["model.layers.0"])
            for d in (torch.bfloat16, torch.bfloat16, torch.float64)]
    assert len(ops_of(runs[1])) > 100
    assert ops_of(runs[1]) == ops_of(runs[2])
    report = numalign.judge(*runs)
    assert report.aligned, str(report)
    assert not any("stop matching" in w for w in report.warnings)
