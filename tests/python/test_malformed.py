"""test_malformed.py: every file of the malformed corpus gets exit 2 and its exact message,
`numalign: error: <file>: <problem>`, from every command that reads traces."""
import json
from pathlib import Path

import pytest

CORPUS = Path(__file__).resolve().parents[1] / "data" / "malformed"
EXPECTED = json.loads((CORPUS / "expected.json").read_text())
SETTINGS = Path(__file__).resolve().parents[1] / "data" / "malformed_settings"
SETTINGS_EXPECTED = json.loads((SETTINGS / "expected.json").read_text())


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_malformed_file_is_refused_with_its_message(cli, name):
    path = CORPUS / name
    before = path.read_bytes()
    for args in (["inspect", path], ["judge", path, path], ["compare", path, path]):
        proc = cli(*args)
        assert proc.returncode == 2, (args, proc.stdout)
        line = proc.stderr.strip()
        head = f"numalign: error: {path}: "
        assert line.startswith(head), line
        want = EXPECTED[name]
        if "message" in want:
            assert line[len(head):] == want["message"]
        else:
            assert line[len(head):].startswith(want["prefix"]), line
    assert path.read_bytes() == before  # inputs are never modified


def test_corpus_covers_the_kinds_of_issue_6():
    assert len(EXPECTED) >= 30


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Valid runs for the settings files to be read against: test fuses ref's q and k."""
    import torch
    from safetensors.torch import save_file

    d = tmp_path_factory.mktemp("runs")
    q, k = torch.linspace(-1, 1, 4), torch.linspace(1, 2, 4)
    save_file({"fused": torch.cat([q, k])}, d / "t.safetensors")
    save_file({"q": q, "k": k}, d / "r.safetensors")
    save_file({"q": q.double(), "k": k.double()}, d / "f.safetensors")
    return [d / f"{n}.safetensors" for n in "trf"]


@pytest.mark.parametrize("name", sorted(SETTINGS_EXPECTED))
def test_malformed_settings_file_is_refused_with_its_message(cli, runs, name):
    """Map and policy files: the CLI exits 2 with `<file>: <problem>`, and Python's judge()
    raises the same words (issue 36: repeated keys at every level, escaped or not)."""
    import numalign

    path = SETTINGS / name
    want = SETTINGS_EXPECTED[name]
    proc = cli("judge", *runs, want["option"], path)
    assert proc.returncode == 2, proc.stdout
    assert proc.stderr.strip() == f"numalign: error: {path}: {want['message']}"
    keyword = "map" if want["option"] == "--map" else "policy"
    with pytest.raises(ValueError) as e:
        numalign.judge(*runs, **{keyword: path})
    assert str(e.value) == f"{path}: {want['message']}"
