"""conftest.py: locate the built CLI and example generator for the Python-side tests."""
import json
import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _binary(var, name):
    path = Path(os.environ.get(var, ROOT / "build" / name))
    if not path.exists():
        pytest.fail(f"{path} is missing: run `make build` first (or set {var})")
    return str(path)


@pytest.fixture(scope="session")
def cli():
    """Runs numalign with arguments; returns the CompletedProcess (text, no check)."""
    exe = _binary("NUMALIGN_CLI", "numalign")

    def run(*args):
        return subprocess.run([exe, *map(str, args)], capture_output=True, text=True)

    return run


@pytest.fixture(scope="session")
def examples(tmp_path_factory):
    out = tmp_path_factory.mktemp("examples")
    subprocess.run([_binary("NUMALIGN_EXAMPLES", "make_example_traces"), str(out)], check=True,
                   capture_output=True)
    return out


@pytest.fixture
def judge_json(cli):
    def run(*args):
        proc = cli("judge", *args, "--format", "json")
        assert proc.returncode in (0, 1), proc.stderr + proc.stdout
        return json.loads(proc.stdout)

    return run
