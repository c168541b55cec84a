"""test_malformed.py: every file of the malformed corpus gets exit 2 and its exact message,
`numalign: error: <file>: <problem>`, from every command that reads traces."""
import json
from pathlib import Path

import pytest

CORPUS = Path(__file__).resolve().parents[1] / "data" / "malformed"
EXPECTED = json.loads((CORPUS / "expected.json").read_text())


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
