"""test_package.py: Trace save/load and interop, nested inputs, errors, assert_aligned's
message, compare.metrics and the pytest plugin."""
import collections
import dataclasses
import gc
import json
import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

import numalign
from numalign import Trace, compare


def test_trace_bytes_equal_save_file_and_round_trip(tmp_path):
    g = torch.Generator().manual_seed(0)
    base = torch.randn(8, 6, dtype=torch.float64, generator=g)
    tensors = {"w.bf16": base.to(torch.bfloat16), "w.fp8": base.to(torch.float8_e4m3fn),
               "w.f16": base.to(torch.float16), "idx": torch.arange(5), "t": base.t()}  # t: non-contiguous
    ours, theirs = tmp_path / "ours.safetensors", tmp_path / "theirs.safetensors"
    Trace(tensors).save(ours)
    save_file({k: v.contiguous() for k, v in tensors.items()}, theirs)
    assert ours.read_bytes() == theirs.read_bytes()
    loaded = Trace.load(theirs)
    for k, v in tensors.items():
        assert loaded[k].dtype == v.dtype and torch.equal(loaded[k], v.contiguous()), k
    assert torch.equal(load_file(ours)["t"], base.t().contiguous())


def test_metadata_round_trip_and_safe_open(tmp_path):
    trace = Trace({"x": torch.ones(3)}, metadata={"role": "ref", "seed": 3, "order": ["x"]},
                  extra_metadata={"format": "pt"})
    path = tmp_path / "m.safetensors"
    trace.save(path)
    again = Trace.load(path)
    assert again.metadata == {"role": "ref", "seed": 3, "order": ["x"]}
    assert again.extra_metadata == {"format": "pt"}
    with safe_open(path, framework="pt") as f:
        assert json.loads(f.metadata()["numalign"])["role"] == "ref"


def test_judge_accepts_paths_nested_structures_and_numpy(tmp_path):
    Point = collections.namedtuple("Point", "a b")

    @dataclasses.dataclass
    class Out:
        logits: torch.Tensor
        past: list

    g = torch.Generator().manual_seed(1)
    u = torch.randn(2000, dtype=torch.float64, generator=g)
    nested = lambda d: Out(logits=u.to(d), past=[Point(u.to(d), u.to(d) * 2)])  # noqa: E731
    report = numalign.judge(nested(torch.bfloat16), nested(torch.bfloat16), nested(torch.float64))
    assert [t["name"] for t in report.tensors] == ["logits", "past.0.a", "past.0.b"]
    assert report.aligned
    Trace({"y": u.to(torch.bfloat16)}).save(tmp_path / "r.safetensors")
    Trace({"y": u}).save(tmp_path / "u.safetensors")
    assert numalign.judge(tmp_path / "r.safetensors", str(tmp_path / "r.safetensors"), tmp_path / "u.safetensors").aligned
    a = u.numpy().astype(ml_dtypes.bfloat16)
    assert numalign.judge({"y": a}, {"y": a}, {"y": u.numpy()}).aligned


def test_judge_leaves_the_garbage_collector_as_it_found_it(monkeypatch):
    # judge holds Python's collector off while it hands the runs over (thousands of small
    # tuples: its collections once took half the time of judging 10,000 small tensors), and
    # gives it back, also when it raises, and never turns on one that was off.
    import numalign.api

    seen = []
    handing_over = numalign.api.as_core_trace

    def watched(run):
        seen.append(gc.isenabled())
        return handing_over(run)

    monkeypatch.setattr(numalign.api, "as_core_trace", watched)
    x = {f"t{i}": torch.full((4,), float(i)) for i in range(50)}
    try:
        assert gc.isenabled()
        assert numalign.judge(x, x).tensors
        assert seen == [False, False], "the runs were handed over with the collector on"
        assert gc.isenabled()
        with pytest.raises(TypeError):
            numalign.judge({"a": "not a tensor"}, x)
        assert gc.isenabled()
        gc.disable()
        numalign.judge(x, x)
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_assert_aligned_names_the_worst_tensor():
    g = torch.Generator().manual_seed(2)
    u = torch.randn(4096, dtype=torch.float64, generator=g)
    with pytest.raises(AssertionError) as err:
        numalign.assert_aligned({"good": u.float(), "bad": (u + 0.1).float()},
                                {"good": u.float(), "bad": u.float()}, {"good": u, "bad": u})
    text = str(err.value)
    assert text.startswith("not aligned: bad\n")
    assert text.index("FAIL     bad") < text.index("PASS     good")


def test_rules_overrides_and_policies():
    u = torch.linspace(1, 2, 1024, dtype=torch.float64)
    ref = u.to(torch.bfloat16)
    test = (ref.view(torch.int16) + 2).view(torch.bfloat16)  # 2 ULP everywhere
    assert not numalign.judge({"x": test}, {"x": ref}, rules="ulp:1").aligned
    with pytest.raises(numalign.NumalignError, match="has no reason"):
        numalign.judge({"x": test}, {"x": ref}, rules={"x": "ulp:2"})
    report = numalign.judge({"x": test}, {"x": ref}, rules={"x": ("ulp:2", "documented 2-ULP kernel")})
    assert report.aligned and report["x"]["override_reason"] == "documented 2-ULP kernel"
    policy = {"overrides": [{"match": "x", "rule": "ulp:2", "reason": "documented"}]}
    assert numalign.judge({"x": test}, {"x": ref}, policy=policy).aligned


def test_bad_inputs_raise_clear_errors():
    with pytest.raises(TypeError, match="cannot judge a object"):
        numalign.judge({"x": object()}, {"x": torch.ones(2)})
    with pytest.raises(TypeError, match="complex"):
        numalign.judge({"x": torch.ones(2, dtype=torch.complex64)}, {"x": torch.ones(2, dtype=torch.complex64)})
    with pytest.raises(numalign.NumalignError, match="bad rule"):
        numalign.judge({"x": torch.ones(2)}, {"x": torch.ones(2)}, rules="ulp:many")
    with pytest.raises(numalign.NumalignError, match="cannot open"):
        numalign.judge("/nonexistent.safetensors", {"x": torch.ones(2)})
    report = numalign.judge({"x": torch.ones(2, 3)}, {"x": torch.ones(3, 2)})
    assert report["x"]["reason"] == "shape mismatch: test [2, 3], ref [3, 2]"


def test_compare_metrics_and_flatten():
    u = torch.tensor([1.0, 2.0, 3.0, 4.0], dtype=torch.float64)
    m = compare.metrics(u + torch.tensor([0.0, 0.0, 0.0, 2.0], dtype=torch.float64), u)
    assert m["rmse"] == pytest.approx(1.0) and m["max_abs"] == 2.0 and m["max_abs_index"] == [3]
    assert m["cosine"] == pytest.approx(float(torch.nn.functional.cosine_similarity(u + torch.tensor([0, 0, 0, 2.0]), u, dim=0)))
    assert list(compare.flatten({"a": [torch.ones(1), {"b": torch.ones(1)}]})) == ["a.0", "a.1.b"]


def test_pytest_plugin_writes_the_session_report(tmp_path):
    (tmp_path / "test_k.py").write_text(
        "import torch, numalign\n"
        "def test_one():\n"
        "    u = torch.randn(100, dtype=torch.float64)\n"
        "    numalign.judge(u.float(), u.float(), u)\n")
    out = tmp_path / "report.json"
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q",  # the entry point loads the plugin
                           f"--numalign-report={out}", str(tmp_path / "test_k.py")],
                          capture_output=True, text=True, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    data = json.loads(out.read_text())
    assert data["judgements"][0]["test"].endswith("test_k.py::test_one")
    assert data["judgements"][0]["report"]["aligned"] is True
    assert (tmp_path / "report.xml").read_text().count("<testcase") == 1


def test_pytest_plugin_never_writes_over_an_input_nor_its_own_json(tmp_path):
    """--numalign-report onto a trace the session judged is refused (as the CLI's -o is), the
    trace kept; a PATH ending in .xml, where the JUnit report would overwrite the JSON, is a
    usage error before any test runs."""
    u = torch.randn(100, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    numalign.Trace({"y": u.float()}).save(tmp_path / "test.safetensors")
    numalign.Trace({"y": u.float()}).save(tmp_path / "ref.safetensors")
    numalign.Trace({"y": u}).save(tmp_path / "truth.safetensors")
    (tmp_path / "test_k.py").write_text(
        "import numalign\n"
        "def test_one():\n"
        "    t = numalign.Trace.load('test.safetensors')\n"
        "    numalign.judge(t, 'ref.safetensors', 'truth.safetensors')\n")
    before = (tmp_path / "test.safetensors").read_bytes()
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "--numalign-report=test.safetensors", "test_k.py"],
                          capture_output=True, text=True, cwd=tmp_path)
    assert proc.returncode != 0, proc.stdout
    assert "refusing to overwrite an input" in proc.stdout + proc.stderr, proc.stdout + proc.stderr
    assert (tmp_path / "test.safetensors").read_bytes() == before
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "--numalign-report=alignment.xml", "test_k.py"],
                          capture_output=True, text=True, cwd=tmp_path)
    assert proc.returncode == 4, proc.stdout + proc.stderr  # pytest's usage error
    assert "alignment.json" in proc.stderr, proc.stderr
    assert not (tmp_path / "alignment.xml").exists()


def test_model_output_style_mappings_flatten_by_key():
    class ModelOutput(collections.OrderedDict):  # the shape of transformers' ModelOutput
        pass

    u = torch.randn(1200, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    out = lambda d: ModelOutput(logits=u.to(d), hidden_states=(u.to(d), u.to(d)))  # noqa: E731
    report = numalign.judge(out(torch.float32), out(torch.float32), out(torch.float64))
    assert [t["name"] for t in report.tensors] == ["logits", "hidden_states.0", "hidden_states.1"]


def test_cpu_tensors_reach_the_core_without_a_copy():
    from numalign._tensors import to_core

    t = torch.randn(1000, dtype=torch.bfloat16, requires_grad=True)
    _, shape, (address, size, owner) = to_core(t, "t")
    assert (address, size, shape) == (t.data_ptr(), 2000, [1000]) and owner is t
    strided = torch.randn(4, 6, dtype=torch.float64)[:, ::2]  # one contiguous copy
    _, shape, (address, size, owner) = to_core(strided, "s")
    assert shape == [4, 3] and size == 96 and owner.is_contiguous()
    assert torch.equal(owner, strided) and address == owner.data_ptr()
    a = np.arange(10, dtype=np.float32)
    assert to_core(a, "a")[2].ctypes.data == a.ctypes.data


def test_pytest_plugin_joins_suites_in_the_core(tmp_path):
    """One <testsuite> per judgement, named by its test, rendered by the core (well-formed for
    any name); the files written by the core's atomic writer, not by the plugin's own code."""
    (tmp_path / "test_two.py").write_text(
        "import torch, numalign\n"
        "u = torch.arange(8, dtype=torch.float64)\n"
        "def test_a():\n"
        "    numalign.judge({'x\\ufffe<&': u.float()}, {'x\\ufffe<&': u.float()}, {'x\\ufffe<&': u})\n"
        "def test_b():\n"
        "    numalign.judge({'y\\n': u.float() + 1}, {'y\\n': u.float()}, {'y\\n': u})\n")
    out = tmp_path / "report.json"
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", f"--numalign-report={out}",
                           str(tmp_path / "test_two.py")], capture_output=True, text=True, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    import xml.dom.minidom
    doc = xml.dom.minidom.parse(str(tmp_path / "report.xml"))
    suites = doc.getElementsByTagName("testsuite")
    assert [s.getAttribute("name") for s in suites] == ["test_two.py::test_a", "test_two.py::test_b"]
    assert [s.getAttribute("failures") for s in suites] == ["0", "1"]
    names = [c.getAttribute("name") for c in doc.getElementsByTagName("testcase")]
    assert names == ["x\\ufffe<&", "y\n"]
    # Each test case carries its pytest node id (as classname), a CI dashboard's test name.
    classes = [c.getAttribute("classname") for c in doc.getElementsByTagName("testcase")]
    assert classes == ["test_two.py::test_a", "test_two.py::test_b"]
    from numalign import pytest_plugin
    source = open(pytest_plugin.__file__).read()
    assert "tempfile" not in source and "<testsuites>" not in source
