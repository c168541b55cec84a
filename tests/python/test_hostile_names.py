"""test_hostile_names.py: tensor names with markup, quotes, newlines and non-ASCII survive every
report format (JSON parses, JUnit is valid XML, text escapes control characters)."""
import json
import xml.etree.ElementTree as ET

import torch
from safetensors.torch import save_file

NAMES = ['<script>alert("x")</script>', "quote\"and'apostrophe", "new\nline\ttab", "ünïcødé.层",
         "amp&ersand", "ctrl\x01char"]


def test_names_survive_every_format(cli, tmp_path):
    g = torch.Generator().manual_seed(0)
    truth = {n: torch.randn(64, dtype=torch.float64, generator=g) for n in NAMES}
    ref = {n: t.to(torch.bfloat16) for n, t in truth.items()}
    test = {n: (t + 0.5).to(torch.bfloat16) if i % 2 else t.to(torch.bfloat16)
            for i, (n, t) in enumerate(truth.items())}
    for role, tensors in (("truth", truth), ("ref", ref), ("test", test)):
        save_file(tensors, tmp_path / f"{role}.safetensors")
    files = [tmp_path / f"{r}.safetensors" for r in ("test", "ref", "truth")]

    report = json.loads(cli("judge", *files, "--format", "json").stdout)
    assert sorted(t["name"] for t in report["tensors"]) == sorted(NAMES)

    junit = cli("judge", *files, "--format", "junit")
    assert junit.returncode == 1
    root = ET.fromstring(junit.stdout)
    cases = root.findall(".//testcase")
    assert len(cases) == len(NAMES)
    assert {c.get("name") for c in cases} >= {'<script>alert("x")</script>', "amp&ersand", "ünïcødé.层"}
    assert len(root.findall(".//failure")) == 3

    text = cli("judge", *files, "--verbose").stdout
    assert "new\\x0aline\\x09tab" in text and "ctrl\\x01char" in text
    assert "\x01" not in text
