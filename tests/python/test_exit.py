"""test_exit.py: a script that keeps numalign objects alive until the interpreter exits ends
quietly (no nanobind leak report on stderr)."""
import subprocess
import sys
import textwrap


def test_objects_alive_at_exit_are_not_reported_as_leaks(tmp_path):
    # Module globals, as a script keeps them: a loaded trace, a tensor viewing its file (torch
    # never releases what such a tensor holds once the interpreter is finalizing), a report.
    script = textwrap.dedent(f"""
        import numpy as np
        import numalign
        u = np.linspace(1, 2, 1000)
        numalign.Trace({{"y": u.astype(np.float32)}}).save({str(tmp_path / "ref.safetensors")!r})
        numalign.Trace({{"y": u}}).save({str(tmp_path / "truth.safetensors")!r})
        TRACE = numalign.Trace.load({str(tmp_path / "ref.safetensors")!r})
        TENSOR = TRACE["y"]
        ARRAY = TRACE.core_tensor("y")[2]
        REPORT = numalign.judge(TRACE, TRACE, {str(tmp_path / "truth.safetensors")!r})
        assert REPORT.aligned and float(TENSOR[0]) == 1.0
        print("judged")
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout == "judged\n", proc.stderr
    assert "leaked" not in proc.stderr, proc.stderr
