"""test_model_trace.py: capture.trace_model (every module's inputs, outputs and gradients in
execution order, in memory or streamed to a file) and the first divergence it lets a
judgement name, on examples/transformer and on small models built to test one thing."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

import numalign
from numalign.capture import trace_model

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "examples" / "transformer"))
import model as transformer  # noqa: E402
import run as transformer_run  # noqa: E402


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 8)
        self.act = torch.nn.GELU()

    def forward(self, x):
        return x + self.act(self.fc(x))


class Shared(torch.nn.Module):
    """`shared` runs twice: before and after `block`."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.shared = torch.nn.Linear(8, 8)
        self.block = Block()

    def forward(self, x):
        return self.shared(self.block(self.shared(x)))


def _x():
    return torch.randn(4, 8, generator=torch.Generator().manual_seed(1))


def test_execution_order_names_a_module_called_twice_by_call_index():
    t = trace_model(Shared(), (_x(),), torch.float32)
    order = t.metadata["order"]
    pos = {n: i for i, n in enumerate(order)}
    assert pos["shared.out"] < pos["block.fc.out"] < pos["block.out"] < pos["shared#1.out"]
    # Children finish before their parent; backward runs the calls in reverse.
    assert pos["block.act.out"] < pos["block.out"]
    assert pos["shared#1.grad"] < pos["block.grad"] < pos["shared.grad"]
    assert t.metadata["tags"]["shared#1.out"] == {"module": "shared", "kind": "output", "call": "1"}
    assert t.metadata["tags"]["block.grad"]["kind"] == "grad"
    assert t.metadata["tags"]["grad.param.shared.weight"] == {
        "module": "shared", "kind": "param-grad", "call": "0"}
    assert t.metadata["inputs"]["shared#1.out"] == ["shared#1.in"]
    assert t.metadata["inputs"]["shared#1.grad"] == ["shared#1.grad_out", "shared#1.in"]
    # What was recorded is what ran: the second call's input is the block's output.
    assert torch.equal(t["shared#1.in"], t["block.out"])
    assert torch.equal(t["shared#1.out"], t["out"])
    assert set(order) == set(t)


def test_modules_select_by_glob_and_the_model_is_left_untouched():
    m = Shared()
    before = {k: v.clone() for k, v in m.state_dict().items()}
    t = trace_model(m, (_x(),), torch.bfloat16, modules=["block.*"])
    modules = {tag["module"] for n, tag in t.metadata["tags"].items() if tag["kind"] == "output"}
    assert modules == {"block.fc", "block.act", ""}
    assert all(torch.equal(before[k], v) for k, v in m.state_dict().items())
    assert all(p.grad is None for p in m.parameters())
    with pytest.raises(TypeError, match="needs a torch.nn.Module"):
        trace_model(lambda x: x, (_x(),), torch.float32)


def test_streamed_trace_equals_the_in_memory_one_and_loads_in_safetensors(tmp_path):
    path = tmp_path / "run.safetensors"
    in_memory = trace_model(Shared(), (_x(),), torch.bfloat16)
    streamed = trace_model(Shared(), (_x(),), torch.bfloat16, save_to=path)
    assert set(streamed) == set(in_memory)
    assert streamed.metadata == in_memory.metadata
    assert streamed.metadata["order"] == list(in_memory), "execution order kept in the metadata"
    # One writer: the streamed file holds the bytes Trace.save (and save_file) write.
    in_memory.save(tmp_path / "saved.safetensors")
    assert path.read_bytes() == (tmp_path / "saved.safetensors").read_bytes()
    os.unlink(tmp_path / "saved.safetensors")
    for name in in_memory:
        assert torch.equal(streamed[name], in_memory[name]), name
    with safe_open(str(path), framework="pt") as f:  # the reference reader
        assert set(f.keys()) == set(in_memory)
        assert torch.equal(f.get_tensor("block.out"), in_memory["block.out"])
    assert os.listdir(tmp_path) == ["run.safetensors"], "no temporary file left behind"


def test_a_failing_model_leaves_no_file(tmp_path):
    class Broken(Shared):
        def forward(self, x):
            self.shared(x)
            raise RuntimeError("kernel fault")

    path = tmp_path / "run.safetensors"
    path.write_bytes(b"an older trace")
    with pytest.raises(RuntimeError, match="kernel fault"):
        trace_model(Broken(), (_x(),), torch.float32, save_to=path)
    assert path.read_bytes() == b"an older trace"
    assert os.listdir(tmp_path) == ["run.safetensors"]


_PEAK_SCRIPT = r"""
import sys, torch
from numalign.capture import run_fwd_bwd, trace_model
torch.manual_seed(0)
layers, width, rows = 24, 512, 1024  # each activation 2 MiB in float32
model = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(layers)])
x = torch.randn(rows, width)
mode = sys.argv[1]
if mode == "plain":  # the same forward and backward, nothing recorded per module
    run_fwd_bwd(model, (x,), torch.float32)
else:
    trace_model(model, (x,), torch.float32, save_to=sys.argv[2] if mode == "stream" else None)
for line in open("/proc/self/status"):
    if line.startswith("VmHWM"):
        print(int(line.split()[1]) * 1024)
"""


def _peak(mode, path=""):
    # A fixed mmap threshold: every tensor's memory is mapped on allocation and returned on
    # free, so the peak counts live tensors (glibc's adaptive threshold otherwise keeps freed
    # blocks in the heap, and the peak moved by 30 MiB from run to run).
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536")
    out = subprocess.run([sys.executable, "-c", _PEAK_SCRIPT, mode, str(path)], check=True,
                         capture_output=True, text=True, env=env).stdout
    return int(out.split()[-1])


def test_streaming_keeps_peak_memory_near_the_plain_run(tmp_path):
    # 24 layers record an input, an output, a gradient and a received gradient of 2 MiB
    # each: about 190 MiB of tensors in all. Streamed, the run's peak stays within a few
    # tensors of the same forward + backward recording only the model's output and grads
    # (run_fwd_bwd), plus the writer's 8 MiB of staging blocks; in memory it cannot.
    # (Measured here: plain 369 MiB, streamed 370 MiB, in memory 564 MiB, before staging.)
    tensor = 1024 * 512 * 4
    staging = 8 << 20
    recorded = 24 * 4 * tensor
    plain = _peak("plain")
    streamed = _peak("stream", tmp_path / "t.safetensors")
    in_memory = _peak("memory")
    print(f"peak RSS: plain {plain / 2**20:.0f} MiB, streamed {streamed / 2**20:.0f} MiB, "
          f"in memory {in_memory / 2**20:.0f} MiB; recorded {recorded / 2**20:.0f} MiB")
    assert streamed - plain < 4 * tensor + staging
    assert in_memory - plain > 0.8 * recorded, "the measure sees what is held"
    assert (tmp_path / "t.safetensors").stat().st_size > recorded


@pytest.fixture(scope="module")
def transformer_runs(tmp_path_factory):
    out = tmp_path_factory.mktemp("transformer")
    return out, transformer_run.capture(str(out))


def test_transformer_first_divergence_is_layer_1_mlp_with_aligned_inputs(transformer_runs):
    _, runs = transformer_runs
    report = numalign.judge(runs["test"], runs["ref"], runs["truth"])
    assert not report.aligned
    forward = report.first_divergence["forward"]
    assert forward["tensor"] == "layers.1.mlp.out"
    assert forward["module"] == "layers.1.mlp"
    assert forward["inputs_aligned"] is True
    # Everything downstream fails too, but inherited: the block after it sees a bad input.
    assert report["layers.1.out"]["verdict"] == "fail"
    text = str(report)
    assert text.index("first divergence, forward: layers.1.mlp.out") < text.index("verdict  tensor")


def test_cli_reports_the_same_first_divergence_from_streamed_files(transformer_runs, cli):
    out, _ = transformer_runs
    p = cli("judge", out / "test.safetensors", out / "ref.safetensors", out / "truth.safetensors",
            "--format", "json")
    assert p.returncode == 1, p.stderr
    d = json.loads(p.stdout)["first_divergence"]
    assert d["forward"] == {"tensor": "layers.1.mlp.out", "module": "layers.1.mlp",
                            "inputs_aligned": True, "failing_inputs": []}


class _GradBug(torch.autograd.Function):
    """Identity forward; backward scales the gradient by (1 + 2^-5), a backward-only bug."""

    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, g):
        return g * (1 + 2 ** -5)


class _Buggy(torch.nn.Module):
    def __init__(self, bug):
        super().__init__()
        self.bug = bug
        self.fc = torch.nn.Linear(8, 8)

    def forward(self, x):
        y = self.fc(x)
        return _GradBug.apply(y) if self.bug else y.clone()


class _Stack(torch.nn.Module):
    def __init__(self, bug_at):
        super().__init__()
        torch.manual_seed(0)
        self.first = _Buggy(bug_at == "first")
        self.second = _Buggy(bug_at == "second")

    def forward(self, x):
        return self.second(torch.tanh(self.first(x)))


def test_a_backward_only_bug_is_the_first_backward_divergence():
    x = _x()
    truth = trace_model(_Stack(None), (x,), torch.float64)
    ref = trace_model(_Stack(None), (x,), torch.float32)
    test = trace_model(_Stack("second"), (x,), torch.float32)
    d = numalign.judge(test, ref, truth).first_divergence
    assert d["forward"] is None, "the forward pass is untouched"
    assert d["backward"]["tensor"] == "second.fc.grad_out"
    assert d["backward"]["module"] == "second", "computed by second's own backward"
    assert d["backward"]["inputs_aligned"] is True
    # Upstream, first's gradient inherits the error through what it received.
    r = numalign.judge(test, ref, truth)
    assert r["first.grad"]["verdict"] == "fail"


def test_traces_without_modules_have_no_first_divergence():
    t = {"y": torch.ones(3)}
    assert numalign.judge(t, t).first_divergence is None


def test_a_trace_held_in_memory_stops_at_its_budget_and_says_to_stream(tmp_path):
    from numalign.capture import RecordingBudgetExceeded
    from numalign._module_hooks import default_memory_budget

    full = trace_model(Shared(), (_x(),), torch.float32)
    size = sum(t.numel() * t.element_size() for t in full.values())
    with pytest.raises(RecordingBudgetExceeded, match=r"past its budget of 256 bytes.*save_to=PATH"):
        trace_model(Shared(), (_x(),), torch.float32, memory_budget=256)
    # Exactly enough is enough; streaming has no budget (memory is bounded by one tensor).
    assert set(trace_model(Shared(), (_x(),), torch.float32, memory_budget=size)) == set(full)
    streamed = trace_model(Shared(), (_x(),), torch.float32, memory_budget=256,
                           save_to=tmp_path / "t.safetensors")
    assert set(streamed) == set(full)
    assert default_memory_budget() > 0


class InPlace(torch.nn.Module):
    """Modules that change their input in place, as torchvision's ReLU(inplace=True) does:
    a recorded `.in` is overwritten just after it is recorded."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.fc = torch.nn.Linear(64, 64)
        self.act = torch.nn.ReLU(inplace=True)
        self.out = torch.nn.Linear(64, 8)

    def forward(self, x):
        return self.out(self.act(self.fc(x)))


def test_a_trace_written_once_reads_back_in_safetensors_and_equals_the_in_memory_one(
        tmp_path, monkeypatch):
    # Large traces keep their data where it was first written (arrival order, the header
    # padded to its reserve); here every trace does, so that a small model shows it. Values
    # changed in place after they were recorded must not reach the file.
    from numalign import _core, _module_hooks

    written = []

    class WriteOnce(_core.TraceStreamWriter):
        def __init__(self, path, header_reserve):
            super().__init__(path, header_reserve=header_reserve, reference_layout_below=0)
            written.append(self)

    monkeypatch.setattr(_module_hooks._core, "TraceStreamWriter", WriteOnce)
    x = torch.randn(32, 64, generator=torch.Generator().manual_seed(3))
    path = tmp_path / "run.safetensors"
    streamed = trace_model(InPlace(), (x,), torch.float32, save_to=path)
    in_memory = trace_model(InPlace(), (x,), torch.float32)
    assert written and written[0].written_once
    # act.in and act.out are one tensor in the model, rectified in place after act.in was
    # recorded: the file holds the input as it was when recorded.
    assert (streamed["act.in"] < 0).any() and (streamed["act.out"] >= 0).all()
    assert torch.equal(streamed["act.in"], in_memory["act.in"])
    with safe_open(str(path), framework="pt") as f:  # the reference reader
        assert set(f.keys()) == set(in_memory)
        for name in in_memory:
            assert torch.equal(f.get_tensor(name), in_memory[name]), name
    assert streamed.metadata == in_memory.metadata
    assert os.listdir(tmp_path) == ["run.safetensors"], "no temporary file left behind"
