"""test_hostile_files.py: the Python side of issue 20's file-system findings: FIFOs are refused,
not waited on; saving resolves links and keeps modes; foreign metadata keys survive a round
trip; tensors with torch's lazy negative / conjugate bits are saved and judged resolved."""
import os
import stat
import subprocess
import sys
import textwrap

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

import numalign


def test_trace_load_refuses_a_fifo_instead_of_hanging(tmp_path):
    fifo = tmp_path / "f.safetensors"
    os.mkfifo(fifo)
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    os.symlink(fifo, ckpt / "a.safetensors")
    (tmp_path / "m.safetensors.index.json").write_text('{"weight_map": {"x": "f.safetensors"}}')
    # In a child with a timeout: before the fix, each of these blocked forever in open().
    code = textwrap.dedent(f"""
        import numalign
        for p in [{str(fifo)!r}, {str(ckpt)!r}, {str(tmp_path / "m.safetensors.index.json")!r}]:
            try:
                numalign.Trace.load(p)
                print("accepted", p)
            except ValueError as e:
                assert "not a regular file" in str(e), str(e)
                print("refused")
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["refused"] * 3, r.stdout


def test_an_index_cannot_reach_outside_its_folder(tmp_path):
    save_file({"w": torch.ones(2)}, tmp_path / "outside.safetensors")
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    for shard in ["../outside.safetensors", str(tmp_path / "outside.safetensors"), "/etc/passwd"]:
        index = ckpt / "m.safetensors.index.json"
        index.write_text('{"weight_map": {"w": %s}}' % __import__("json").dumps(shard))
        with pytest.raises(ValueError, match="outside the index's folder"):
            numalign.Trace.load(index)


def test_an_index_names_each_key_once(tmp_path):
    """Which shard holds w, and which weight_map counts? A repeated key is refused at any
    level of the index, as in every JSON numalign reads (issue 36)."""
    for name in "ab":
        save_file({"w": torch.ones(2)}, tmp_path / f"{name}.safetensors")
    index = tmp_path / "m.safetensors.index.json"
    for text, where in (('{"weight_map": {"w": "a.safetensors", "w": "b.safetensors"}}',
                         'the index.weight_map: the key "w"'),
                        ('{"weight_map": {"w": "a.safetensors"}, "weight_map": {}}',
                         'the index: the key "weight_map"')):
        index.write_text(text)
        with pytest.raises(ValueError) as e:
            numalign.Trace.load(index)
        assert str(e.value) == (f"{index}: {where} is given twice (each key once: which one "
                                "was meant?)")


def test_save_follows_a_link_and_keeps_the_mode(tmp_path):
    real = tmp_path / "real.safetensors"
    save_file({"x": torch.zeros(2)}, real)
    os.chmod(real, 0o600)
    link = tmp_path / "link.safetensors"
    os.symlink(real.name, link)
    numalign.Trace({"x": torch.ones(3)}).save(link)
    assert link.is_symlink()
    assert stat.S_IMODE(os.stat(real).st_mode) == 0o600
    assert numalign.Trace.load(real)["x"].tolist() == [1.0, 1.0, 1.0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link.safetensors", "real.safetensors"]


def test_foreign_metadata_keys_survive_a_round_trip(tmp_path):
    src = tmp_path / "a.safetensors"
    save_file({"x": torch.arange(4.0)}, src, metadata={"format": "pt", "user key": "v"})
    t = numalign.Trace.load(src)
    t.metadata = {"role": "ref"}
    t["y"] = torch.ones(2)
    t.save(tmp_path / "b.safetensors")
    with safe_open(tmp_path / "b.safetensors", "pt") as f:
        meta = f.metadata()
    assert meta["format"] == "pt" and meta["user key"] == "v", meta
    assert numalign.Trace.load(tmp_path / "b.safetensors").metadata == {"role": "ref"}


def lazily_negated():
    x = torch.arange(1.0, 7.0).reshape(2, 3)
    yield "neg_view", torch._neg_view(x), -x
    c = torch.complex(x, 2 * x)
    yield "conj_imag", c.conj().imag, -2 * x
    yield "conj_imag_contiguous_view", torch._neg_view(x.t().contiguous()).t(), -x


@pytest.mark.parametrize("name,lazy,plain", list(lazily_negated()), ids=lambda v: v if isinstance(v, str) else "")
def test_negative_and_conjugate_bits_are_resolved(tmp_path, name, lazy, plain):
    assert not torch.equal(lazy.resolve_neg(), lazy.resolve_neg().neg())  # nonzero data
    assert numalign.judge({"t": lazy}, {"t": plain}, rules="exact").aligned, name
    assert not numalign.judge({"t": lazy}, {"t": -plain}, rules="exact").aligned, name
    numalign.Trace({"t": lazy}).save(tmp_path / "t.safetensors")
    assert torch.equal(numalign.Trace.load(tmp_path / "t.safetensors")["t"], plain)


def test_the_pytest_plugin_report_writer_follows_links_and_keeps_the_mode(tmp_path):
    from numalign import pytest_plugin
    real = tmp_path / "real.json"
    real.write_text("old")
    os.chmod(real, 0o640)
    link = tmp_path / "report.json"
    os.symlink(real.name, link)
    pytest_plugin._write_atomic(str(link), "{}\n")
    assert link.is_symlink() and real.read_text() == "{}\n"
    assert stat.S_IMODE(os.stat(real).st_mode) == 0o640
    assert sorted(p.name for p in tmp_path.iterdir()) == ["real.json", "report.json"]


def test_fingerprints_see_values_not_lazy_bits():
    from numalign._tensors import fingerprint
    x = torch.arange(1.0, 5.0)
    assert fingerprint(torch._neg_view(x)) == fingerprint(-x)


def test_a_trace_truncated_while_loaded_raises_and_the_interpreter_survives(tmp_path):
    x = torch.randn(1 << 20)
    for name, t in (("test", x), ("ref", x), ("truth", x.double())):
        save_file({"a": t}, tmp_path / f"{name}.safetensors")
    # In a child: before the fix the interpreter died of SIGBUS.
    code = textwrap.dedent(f"""
        import os, numalign
        d = {str(tmp_path)!r}
        t = numalign.Trace.load(d + "/test.safetensors")
        os.truncate(d + "/test.safetensors", 100)
        try:
            numalign.judge(t, d + "/ref.safetensors", d + "/truth.safetensors")
            print("judged")
        except ValueError as e:
            assert "test.safetensors" in str(e) and "changed while being read" in str(e), str(e)
            print("raised")
        print("alive")
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, (r.returncode, r.stderr)
    assert r.stdout.split() == ["raised", "alive"], r.stdout


def test_saving_a_trace_whose_file_shrank_names_that_file(tmp_path):
    """Trace.save of a loaded trace copies from the mapping: when its file has since shrunk,
    the error names that input (it named the output, "write failed: Bad address"), no copy
    appears, and the interpreter lives on (issue 36, 18)."""
    save_file({"a": torch.randn(1 << 20)}, tmp_path / "test.safetensors")
    code = textwrap.dedent(f"""
        import os, numalign
        d = {str(tmp_path)!r}
        t = numalign.Trace.load(d + "/test.safetensors")
        os.truncate(d + "/test.safetensors", 4096)
        try:
            t.save(d + "/copy.safetensors")
            print("saved")
        except ValueError as e:
            message = str(e)
            assert message.startswith(d + "/test.safetensors: changed while being copied"), message
            assert "copy.safetensors" in message, message
            print("raised")
        print("alive")
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, (r.returncode, r.stderr)
    assert r.stdout.split() == ["raised", "alive"], r.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == ["test.safetensors"]


def test_a_tensor_of_a_trace_whose_file_shrank_raises_instead_of_killing(tmp_path):
    """A loaded trace's tensor read after its file shrank: ValueError naming the file, and the
    interpreter lives on (a view of the mapping died of SIGBUS wherever torch read it); a
    tensor taken before stays whole, as a copy."""
    x = torch.randn(1 << 20)
    save_file({"a": x, "b": x.clone()}, tmp_path / "test.safetensors")
    code = textwrap.dedent(f"""
        import os, torch, numalign
        d = {str(tmp_path)!r}
        t = numalign.Trace.load(d + "/test.safetensors")
        a = t["a"]
        before = float(a.sum())
        os.truncate(d + "/test.safetensors", 4096)
        print("kept" if float(a.sum()) == before else "changed")
        try:
            print(float(t["b"].sum()))
        except ValueError as e:
            assert str(e).startswith(d + "/test.safetensors: changed while being read"), str(e)
            print("raised")
        print("alive")
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, (r.returncode, r.stderr)
    assert r.stdout.split() == ["kept", "raised", "alive"], r.stdout
