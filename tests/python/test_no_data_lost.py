"""test_no_data_lost.py: outputs are written atomically: a write killed half way leaves the
previous file intact under its name, and inputs are never touched."""
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
import torch
from safetensors.torch import save_file


def test_killed_write_leaves_the_previous_output_intact(tmp_path):
    big = tmp_path / "big.safetensors"
    save_file({"w": torch.zeros(48 * 1024 * 1024, dtype=torch.float64)}, big)  # 384 MiB
    out = tmp_path / "out.safetensors"
    out.write_bytes(b"previous report")
    stat_in = big.stat()
    cli = os.environ.get("NUMALIGN_CLI", "build/numalign")
    proc = subprocess.Popen([cli, "pack", str(big), "-o", str(out)])
    deadline = time.time() + 30
    while time.time() < deadline and proc.poll() is None:
        if any(p.name.startswith(".out.safetensors.tmp.") for p in tmp_path.iterdir()):
            proc.send_signal(signal.SIGKILL)  # mid-write: the temporary file exists
            break
        time.sleep(0.001)
    proc.wait()
    if proc.returncode == -signal.SIGKILL:
        assert out.read_bytes() == b"previous report"
    else:  # finished before it could be interrupted: then it must be complete
        assert out.stat().st_size == big.stat().st_size
    assert big.stat().st_mtime_ns == stat_in.st_mtime_ns and big.stat().st_size == stat_in.st_size


@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM"])
def test_a_signal_during_trace_model_save_to_leaves_no_file(tmp_path, sig):
    """The streaming writer's side file and output go with the run: Ctrl-C (KeyboardInterrupt
    aborts the writer) and SIGTERM (the core's handler removes its temporaries) leave the
    folder as it was, and the process still dies by the signal, as its parent expects."""
    target = tmp_path / "trace.safetensors"
    code = textwrap.dedent(f"""
        import os, signal, torch
        from numalign.capture import trace_model

        class SignalledMidRun(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.a, self.b = torch.nn.Linear(256, 256), torch.nn.Linear(256, 256)

            def forward(self, x):
                y = self.a(x)  # recorded, so the side file exists
                os.kill(os.getpid(), signal.{sig})
                return self.b(y)

        trace_model(SignalledMidRun(), (torch.randn(64, 256),), torch.float32,
                    save_to={str(target)!r})
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == -getattr(signal, sig), r.stderr
    assert list(tmp_path.iterdir()) == []


def test_a_report_past_the_file_size_limit_is_a_clear_error_and_leaves_no_file(tmp_path):
    """Under `ulimit -f` a write past the limit fails (EFBIG): the CLI names the output, exits
    2 and leaves neither the report nor its temporary (SIGXFSZ used to kill it mid-write and
    leave `.numalign-tmp.*`)."""
    import resource

    truth = torch.linspace(-1, 1, 4096, dtype=torch.float64)
    ref = truth.to(torch.float32)
    for name, t in {"t": ref, "r": ref, "f": truth}.items():
        save_file({"y": t}, tmp_path / f"{name}.safetensors")
    out = tmp_path / "out" / "report.json"
    out.parent.mkdir()

    def small_file_limit():
        resource.setrlimit(resource.RLIMIT_FSIZE, (512, 512))

    cli = os.environ.get("NUMALIGN_CLI", "build/numalign")
    r = subprocess.run(
        [cli, "judge", *(str(tmp_path / f"{n}.safetensors") for n in "trf"), "--format", "json",
         "-o", str(out)],
        capture_output=True, text=True, timeout=60, preexec_fn=small_file_limit)
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert str(out) in r.stderr and "File too large" in r.stderr, r.stderr
    assert list(out.parent.iterdir()) == []
