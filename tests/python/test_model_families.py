"""test_model_families.py: model families as users build and call them, from small configs:
a clean port is ALIGNED with no warnings, a planted bug is named where it was planted
(issue 35). Hugging Face decoders and encoders are in test_hf_models.py."""
import pytest
import torch

import numalign
from numalign.capture import isolate, trace_model
from no_warnings import quiet


class BasicBlock(torch.nn.Module):
    """A ResNet basic block: two 3x3 convolutions with BatchNorm and a residual."""

    def __init__(self, channels):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn1 = torch.nn.BatchNorm2d(channels)
        self.conv2 = torch.nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn2 = torch.nn.BatchNorm2d(channels)

    def forward(self, x):
        y = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(x + self.bn2(self.conv2(y)))


class ResNet(torch.nn.Module):
    def __init__(self, channels=8, classes=10):
        super().__init__()
        self.stem = torch.nn.Conv2d(3, channels, 3, padding=1, bias=False)
        self.bn = torch.nn.BatchNorm2d(channels)
        self.layer1 = BasicBlock(channels)
        self.layer2 = BasicBlock(channels)
        self.fc = torch.nn.Linear(channels, classes)

    def forward(self, x):
        x = torch.relu(self.bn(self.stem(x)))
        x = self.layer2(self.layer1(x))
        return self.fc(x.mean((2, 3)))


def resnet(seed=0):
    """A small ResNet whose BatchNorm statistics are those of a trained one (not 0 and 1)."""
    torch.manual_seed(seed)
    model = ResNet()
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.running_mean.uniform_(-0.5, 0.5)
                m.running_var.uniform_(0.5, 2.0)
                m.weight.uniform_(0.5, 1.5)
                m.bias.uniform_(-0.2, 0.2)
    return model


class Im2colConv2d(torch.nn.Conv2d):
    """A port's convolution: unfold and one matrix product (other sums, other rounding), the
    same parameters under the same names."""

    def forward(self, x):
        n, _, h, w = x.shape
        cols = torch.nn.functional.unfold(x, self.kernel_size, padding=self.padding,
                                          stride=self.stride)
        y = self.weight.flatten(1) @ cols
        return y.reshape(n, self.out_channels, h // self.stride[0], w // self.stride[1])


def im2col_port(model):
    """The same model with every convolution computed as Im2colConv2d."""
    for m in model.modules():
        if type(m) is torch.nn.Conv2d:
            m.__class__ = Im2colConv2d
    return model


def images():
    return torch.randn(4, 3, 16, 16, generator=torch.Generator().manual_seed(1))


def judge_runs(test_model, ref_model, x, dtype=torch.bfloat16):
    return numalign.judge(quiet(trace_model, test_model, x, dtype),
                          quiet(trace_model, ref_model, x, dtype),
                          quiet(trace_model, ref_model, x, torch.float64, truth_of=dtype))


@pytest.mark.parametrize("mode", ["eval", "train"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_a_resnet_with_batchnorm_records_in_low_precision_and_a_clean_port_passes(mode, dtype):
    """BatchNorm's running statistics are cast with the module, as torch's .to(dtype) casts
    them (they were left float32: "expected scalar type BFloat16 but found Float" for every
    CNN); a port computing its convolutions another way, on channels_last inputs, passes."""
    ref = getattr(resnet(), mode)()
    port = im2col_port(getattr(resnet(), mode)()).to(memory_format=torch.channels_last)
    x = images()
    report = judge_runs(port, ref, x.contiguous(memory_format=torch.channels_last), dtype)
    assert report.aligned, str(report)
    assert report.warnings == [], report.warnings
    test_run = trace_model(port, x, dtype)
    assert test_run["bn.out"].dtype == dtype
    # The caller's model is left as it was: float32 statistics, not updated by the runs.
    assert port.bn.running_mean.dtype == torch.float32
    assert torch.equal(port.bn.running_mean, resnet().bn.running_mean)


def test_the_truth_sees_the_statistics_the_runs_hold():
    """With truth_of, the truth's BatchNorm statistics are the bf16 ones, widened."""
    ref = resnet().eval()
    truth_copy_stats = []

    def record(module, args, out):
        truth_copy_stats.append(module.running_var.clone())

    ref.bn.register_forward_hook(record)
    trace_model(ref, images(), torch.float64, truth_of=torch.bfloat16)
    held = truth_copy_stats[-1]
    assert held.dtype == torch.float64
    assert torch.equal(held, resnet().bn.running_var.to(torch.bfloat16).to(torch.float64))


def test_a_batchnorm_with_the_wrong_eps_is_named():
    ref = resnet().eval()
    port = resnet().eval()
    port.layer2.bn1.eps = 1e-2  # a port that took another framework's default
    report = judge_runs(port, ref, images())
    assert not report.aligned
    d = report.first_divergence
    assert d["forward"]["module"] == "layer2.bn1", d
    assert d["forward"]["inputs_aligned"] is True
    ranked = isolate(port, ref, images(), torch.bfloat16).ranking
    assert ranked[0]["module"] == "layer2.bn1", ranked[:3]


def test_a_compiled_model_is_recorded_under_its_source_names_and_judged_against_the_plain_one():
    """torch.compile (inductor: its own kernels, other rounding) against the plain model: the
    compiled run is recorded at its outputs and parameters' gradients, without hooks inside
    it (they pushed Dynamo to its recompile limit), and named as the source is (every name
    carried `_orig_mod.` and nothing paired, issue 35, 4)."""
    compiled = torch.compile(resnet().eval(), backend="inductor")
    x = images()
    test = quiet(trace_model, compiled, x, torch.bfloat16)
    assert "out" in test and "grad.param.layer1.conv1.weight" in test
    assert not any("_orig_mod" in n for n in test)
    ref = quiet(trace_model, resnet().eval(), x, torch.bfloat16, modules=[])
    truth = quiet(trace_model, resnet().eval(), x, torch.float64, truth_of=torch.bfloat16,
                  modules=[])
    assert sorted(test) == sorted(ref)
    report = numalign.judge(test, ref, truth)
    assert report.aligned and report.warnings == [], str(report)
    with pytest.raises(ValueError, match="modules=\\[\\] for it"):
        trace_model(compiled, x, torch.bfloat16, modules=["layer1.*"])
    with pytest.raises(ValueError, match="pass the uncompiled model"):
        isolate(compiled, resnet().eval(), x, torch.bfloat16)


def test_a_model_under_autocast_is_recorded_with_its_compute_dtype():
    """trace_model(..., autocast=torch.bfloat16): float32 parameters and inputs, the forward
    pass under torch.autocast, recorded as "float32+autocast(bfloat16)" (it was recorded as
    plain float32, issue 35, 9); its truth rounds to what the runs hold (float32)."""
    x = images()
    port = im2col_port(resnet().eval())
    runs = [quiet(trace_model, port, x, torch.float32, autocast=torch.bfloat16),
            quiet(trace_model, resnet().eval(), x, torch.float32, autocast=torch.bfloat16),
            quiet(trace_model, resnet().eval(), x, torch.float64, truth_of=torch.float32)]
    assert runs[0].metadata["dtype_recipe"] == "float32+autocast(bfloat16)"
    assert runs[0]["stem.out"].dtype == torch.bfloat16  # a convolution computes in bf16
    assert runs[0]["grad.param.stem.weight"].dtype == torch.float32  # parameters stay float32
    report = numalign.judge(*runs)
    assert report.aligned and report.warnings == [], str(report)
    broken = im2col_port(resnet().eval())
    broken.layer2.bn1.eps = 1e-2
    wrong = numalign.judge(trace_model(broken, x, torch.float32, autocast=torch.bfloat16),
                           *runs[1:])
    assert wrong.first_divergence["forward"]["module"] == "layer2.bn1", str(wrong)
    isolated = isolate(broken, resnet().eval(), x, torch.float32, autocast=torch.bfloat16)
    assert isolated.ranking[0]["module"] == "layer2.bn1", isolated.ranking[:3]
    with pytest.raises(ValueError, match="not for their float64 truth"):
        trace_model(resnet(), x, torch.float64, autocast=torch.bfloat16)
