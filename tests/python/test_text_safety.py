"""test_text_safety.py: hostile names, metadata values and paths never reach a terminal raw
(control characters C0 / C1 / DEL, bidi controls, invalid UTF-8) in any text output; names are
cut only at character boundaries; JUnit is well-formed XML and JSON valid UTF-8 for any input."""
import json
import os
import subprocess
import xml.dom.minidom

import pytest
import torch
from safetensors.torch import save_file

import numalign

# ESC (colour), an OSC 8 hyperlink, a carriage return that overwrites the line, the one-byte
# CSI (U+009B), bidi overrides / isolates / marks, DEL, BEL.
HOSTILE = ["esc\x1b[31mred", "\x1b]8;;http://evil.example/\x07link\x1b]8;;\x07", "over\rwrite",
           "csi\u009b31m", "rlo\u202egnp.exe", "iso\u2066x\u2069", "mark\u200e\u200f\u061c",
           "del\x7f", "bell\x07"]
BIDI = "\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069\u200e\u200f\u061c"


def unsafe(text: str) -> list:
    """Characters a terminal would act on: C0 but newline, DEL, C1, bidi controls."""
    return [c for c in text if (ord(c) < 0x20 and c != "\n") or 0x7F <= ord(c) <= 0x9F or c in BIDI]


def run(cli_path, *args):
    """Runs the CLI on byte arguments; stdout and stderr must be valid UTF-8 (strict)."""
    proc = subprocess.run([cli_path, *args], capture_output=True)
    return proc.returncode, proc.stdout.decode("utf-8"), proc.stderr.decode("utf-8")


@pytest.fixture
def exe():
    return os.environ.get("NUMALIGN_CLI", os.path.join(os.path.dirname(__file__), "../../build/numalign"))


def _traces(tmp_path, names, metadata=None):
    g = torch.Generator().manual_seed(0)
    truth = {n: torch.randn(64, dtype=torch.float64, generator=g) for n in names}
    ref = {n: t.to(torch.bfloat16) for n, t in truth.items()}
    test = {n: (t + 0.5).to(torch.bfloat16) for n, t in truth.items()}  # every tensor fails
    paths = []
    for role, tensors in (("test", test), ("ref", ref), ("truth", truth)):
        p = tmp_path / f"{role}.safetensors"
        save_file(tensors, p, metadata=metadata)
        paths.append(str(p))
    return paths


def test_every_text_output_escapes_hostile_names(tmp_path, exe):
    metadata = {"note": HOSTILE[1] + HOSTILE[0] + HOSTILE[4], "key\x1b[1m": "v\r"}
    files = _traces(tmp_path, HOSTILE, metadata)
    outputs = {
        "judge": run(exe, "judge", *files, "--verbose"),
        "compare": run(exe, "compare", files[0], files[1], "--rule", "ulp:0"),
        "inspect": run(exe, "inspect", files[0]),
        "consistent": run(exe, "consistent", files[0], files[1]),
        "sensitivity": run(exe, "sensitivity", *files),
        "html": run(exe, "judge", *files, "--format", "html"),
        "dump-missing": run(exe, "dump", files[0], "no\x1b[2Jsuch\u202e"),
        "bad-rule": run(exe, "judge", *files, "--rule", "x\x1b[31m=nonsense\u009b"),
    }
    for what, (rc, out, err) in outputs.items():
        assert rc in (0, 1, 2), what
        assert unsafe(out) == [], (what, unsafe(out))
        assert unsafe(err) == [], (what, unsafe(err))
    # The names are still there, escaped visibly.
    assert "esc\\x1b[31mred" in outputs["judge"][1]
    assert "csi\\u009b31m" in outputs["inspect"][1]
    assert outputs["dump-missing"][0] == 2 and "no\\x1b[2Jsuch\\u202e" in outputs["dump-missing"][2]


def test_error_messages_escape_paths(tmp_path, exe):
    bad = tmp_path / "evil\x1b]8;;http:x\x07name\u202e.safetensors"
    bad.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00not json at all!")
    for args in (["inspect", str(bad)], ["judge", str(bad), str(bad)], ["inspect", str(tmp_path / "gone\r.st")]):
        rc, out, err = run(exe, *args)
        assert rc == 2 and err.startswith("numalign: error: ")
        assert unsafe(err) == [] and unsafe(out) == []


def test_invalid_utf8_paths_give_valid_utf8_text_and_json(tmp_path, exe):
    files = _traces(tmp_path, ["a", "b"])
    odd = os.path.join(os.fsencode(tmp_path), b"rank\xff\xfe1.safetensors")
    with open(files[1], "rb") as src, open(odd, "wb") as dst:
        dst.write(src.read())
    for fmt in ("text", "json"):
        rc, out, err = run(exe, "consistent", files[1].encode(), odd, "--format", fmt)
        assert rc == 0, err
        if fmt == "json":
            report = json.loads(out)
            assert any("rank" in f for f in json.dumps(report).split('"'))
        assert unsafe(out) == []
    rc, out, err = run(exe, "inspect", os.path.join(os.fsencode(tmp_path), b"no\xffne.st"))
    assert rc == 2 and "\\xff" in err


def test_inspect_cuts_long_values_at_character_boundaries(tmp_path, exe):
    files = _traces(tmp_path, ["w"], {"note": "权" * 150})  # 450 bytes: cut somewhere inside
    rc, out, err = run(exe, "inspect", files[0])
    assert rc == 0
    assert "权" * 20 in out and "..." in out


CJK = "层" * 30 + ".权重"


def test_multibyte_names_render_in_text_reports():
    t = torch.arange(64, dtype=torch.float64)
    report = numalign.judge({CJK: (t + 9).bfloat16()}, {CJK: t.bfloat16()}, {CJK: t})
    assert not report.aligned
    text = str(report)
    assert ".权重" in text  # the tail, which tells names apart, is kept
    assert "层" in report.text(True)
    with pytest.raises(AssertionError, match="NOT ALIGNED"):
        numalign.assert_aligned({CJK: (t + 9).bfloat16()}, {CJK: t.bfloat16()}, {CJK: t})


def test_cjk_names_in_the_cli_table(tmp_path, exe):
    names = [CJK, "层" * 13 + "é" * 7 + ".权重", "x" * 36 + "层.b"]
    files = _traces(tmp_path, names)
    rc, out, err = run(exe, "judge", *files)
    assert rc == 1
    rows = [line for line in out.splitlines() if line.startswith("FAIL")]
    assert len(rows) == len(names)


def test_lone_surrogate_in_a_name_is_a_clear_error():
    t = torch.ones(4)
    bad = "layer\ud800.weight"
    for call in (lambda: numalign.judge({bad: t}, {bad: t}, rules="exact"),
                 lambda: numalign.judge({"a": {bad: t}}, {"a": {bad: t}}, rules="exact"),
                 lambda: numalign.trace.as_core_trace({bad: t})):
        with pytest.raises(ValueError) as e:
            call()
        assert repr(bad)[1:-1] in str(e.value) and "UTF-8" in str(e.value)


NASTY_XML = ["bom\ufffe", "nonchar\uffff", "c0\x01\x02\x0b\x0c", "lf\nline", "tab\tx", "cr\rx",
             "c1\u0085\u009b", "bidi\u202e", "del\x7f", "ampersand&<>\"'", "fine.层"]


def test_junit_is_well_formed_and_names_read_back(tmp_path, exe):
    files = _traces(tmp_path, NASTY_XML)
    rc, out, err = run(exe, "judge", *files, "--format", "junit")
    assert rc == 1
    doc = xml.dom.minidom.parseString(out.encode("utf-8"))
    names = [c.getAttribute("name") for c in doc.getElementsByTagName("testcase")]
    assert len(names) == len(NASTY_XML)
    # What XML 1.0 can hold comes back exactly (whitespace too, through character references).
    for exact in ("lf\nline", "tab\tx", "cr\rx", "c1\u0085\u009b", "bidi\u202e", "del\x7f",
                  "ampersand&<>\"'", "fine.层"):
        assert exact in names, exact
    # What it cannot hold is replaced visibly, never dropped or passed raw.
    assert "bom\\ufffe" in names and "nonchar\\uffff" in names and "c0\\x01\\x02\\x0b\\x0c" in names
    assert unsafe(out.replace("\n", "")) == []  # the file itself is safe to cat
    # The Python binding renders the same.
    t = torch.arange(8, dtype=torch.float64)
    report = numalign.judge({n: t for n in NASTY_XML}, {n: t + 1 for n in NASTY_XML}, rules="exact")
    xml.dom.minidom.parseString(report.to_junit().encode("utf-8"))


def test_json_reports_round_trip_nasty_names(tmp_path, exe):
    files = _traces(tmp_path, NASTY_XML)
    rc, out, err = run(exe, "judge", *files, "--format", "json")
    assert sorted(t["name"] for t in json.loads(out)["tensors"]) == sorted(NASTY_XML)


def test_lone_surrogate_in_options_is_a_clear_error():
    """Every text option that crosses to the core is checked like a tensor name: a lone
    surrogate gets a ValueError naming the option, not the binding's TypeError (issue 36, 17)."""
    t = torch.ones(4)
    bad = "layer\udcff.*"
    calls = [
        ("only", lambda: numalign.judge({"a": t}, {"a": t}, rules="exact", only=bad)),
        ("only", lambda: numalign.judge({"a": t}, {"a": t}, rules="exact", only=["a", bad])),
        ("rules", lambda: numalign.judge({"a": t}, {"a": t}, rules={bad: "exact"})),
        ("rules", lambda: numalign.judge({"a": t}, {"a": t}, rules={"a": ("ulp:4", bad)})),
        ("rules", lambda: numalign.judge({"a": t}, {"a": t}, rules=[bad + "=exact"])),
        ("shared_randomness", lambda: numalign.judge({"a": t}, {"a": t}, rules="exact",
                                                     shared_randomness=bad)),
    ]
    for option, call in calls:
        with pytest.raises(ValueError) as e:
            call()
        assert option in str(e.value) and repr(bad)[1:-1] in str(e.value), str(e.value)
        assert "UTF-8" in str(e.value)


def test_paths_that_are_not_utf8_work_everywhere(tmp_path):
    """A folder whose name is not UTF-8 (a byte Python holds as a lone surrogate) is a path
    like any other: saved, loaded, judged, reported on, as str, bytes or pathlib (issue 36,
    16)."""
    import pathlib

    folder = os.path.join(os.fsdecode(bytes(tmp_path)), os.fsdecode(b"caf\xe9"))
    os.mkdir(folder)
    truth = torch.linspace(-1, 1, 64, dtype=torch.float64)
    runs = {}
    for role, t in (("test", truth.float()), ("ref", truth.float()), ("truth", truth)):
        runs[role] = os.path.join(folder, role + ".safetensors")
        numalign.Trace({"y": t}).save(runs[role])
    loaded = numalign.Trace.load(runs["test"])
    assert torch.equal(loaded["y"], truth.float())
    for kind in (str, os.fsencode, pathlib.Path):
        assert numalign.judge(*(kind(runs[r]) for r in ("test", "ref", "truth"))).aligned
    report = os.path.join(folder, "report.json")
    numalign.trace.Trace.load(runs["ref"]).save(os.path.join(folder, "copy.safetensors"))
    from numalign import _core
    _core.write_file(report, "{}", [runs["test"]])
    assert open(os.fsencode(report), "rb").read() == b"{}"
    with pytest.raises(ValueError, match="refusing to overwrite an input"):
        _core.write_file(runs["test"], "{}", [runs["test"]])
    assert _core.rank_trace_path(runs["test"], 1) == runs["test"].replace(".safetensors",
                                                                          ".rank1.safetensors")


def test_a_nul_in_a_path_is_refused_not_cut(tmp_path):
    """The system would read "a.safetensors\\0x" as "a.safetensors": a NUL is refused by name
    wherever a path is opened or written."""
    real = tmp_path / "a.safetensors"
    numalign.Trace({"y": torch.ones(2)}).save(real)
    with pytest.raises(ValueError, match="NUL byte"):
        numalign.Trace.load(str(real) + "\0x")
    with pytest.raises(ValueError, match="NUL byte"):
        numalign.Trace({"y": torch.ones(2)}).save(str(tmp_path / "b.safetensors") + "\0x")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.safetensors"]
