"""test_stubs.py: the checked-in type stubs of numalign._core are what nanobind's stub
generator writes for the installed module, and ship with the package."""
import subprocess
import sys
from pathlib import Path

import numalign

ROOT = Path(__file__).resolve().parents[2]
STUB = ROOT / "python" / "numalign" / "_core.pyi"


def test_core_stub_is_regenerated_byte_for_byte(tmp_path):
    out = tmp_path / "_core.pyi"
    # From tmp_path, so that stubgen imports the installed package (as `make stubs` does).
    subprocess.run([sys.executable, "-m", "nanobind.stubgen", "-q", "-m", "numalign._core",
                    "-p", str(ROOT / "python" / "stubgen-patterns.txt"), "-o", str(out)],
                   cwd=tmp_path, check=True, capture_output=True, text=True)
    assert out.read_bytes() == STUB.read_bytes(), (
        f"{STUB.relative_to(ROOT)} differs from the stub of the installed numalign._core: "
        "run `make stubs` (and commit the result)")


def test_stub_and_marker_are_installed():
    package = Path(numalign.__file__).parent
    assert (package / "py.typed").is_file()
    assert (package / "_core.pyi").read_bytes() == STUB.read_bytes(), "reinstall: make install-python"
