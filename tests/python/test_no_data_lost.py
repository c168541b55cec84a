"""test_no_data_lost.py: outputs are written atomically: a write killed half way leaves the
previous file intact under its name, and inputs are never touched."""
import os
import signal
import subprocess
import time

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
