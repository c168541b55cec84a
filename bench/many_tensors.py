"""A million small tensors: what numalign judge costs per tensor, against a simdjson floor.

Writes test, ref (F32) and truth (F64) traces of N tensors of 16 elements (1,000,000 by
default; 1% of the tensors carry an error that fails them), then times, alternating and
--repeat times each:
  floor  build/header_floor: the three headers parsed with simdjson, every entry visited
         (name, dtype, shape, offsets): the least any judge of these files must do
  text   numalign judge ... -o report.txt
  json   numalign judge ... --format json -o report.json
  html   numalign judge ... --format html -o report.html
and prints a Markdown table of median seconds, peak RSS, output size and ratio to the floor.
Needs numpy only (the traces are written directly in the safetensors layout).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import machine_description  # noqa: E402

ELEMENTS = 16


def write_trace(path, names, dtype, data, role):
    """One safetensors file: names in order, each a row of `data` (already in `dtype`)."""
    code = {np.float32: "F32", np.float64: "F64"}[dtype]
    size = np.dtype(dtype).itemsize * ELEMENTS
    meta = json.dumps({"role": role})
    parts = ['{"__metadata__":{"numalign":' + json.dumps(meta) + "}"]
    parts.extend(f',"{n}":{{"dtype":"{code}","shape":[{ELEMENTS}],"data_offsets":[{i * size},'
                 f"{(i + 1) * size}]}}" for i, n in enumerate(names))
    parts.append("}")
    header = "".join(parts).encode()
    header += b" " * (-len(header) % 8)
    tmp = path.with_suffix(".tmp")
    with open(tmp, "wb") as f:
        f.write(len(header).to_bytes(8, "little"))
        f.write(header)
        f.write(np.ascontiguousarray(data, dtype=dtype).tobytes())
    os.replace(tmp, path)


def make(count, out_dir, seed=0):
    """out_dir/{test,ref,truth}.safetensors, unless there already for these arguments."""
    out_dir.mkdir(parents=True, exist_ok=True)
    spec = {"count": count, "elements": ELEMENTS, "seed": seed}
    stamp = out_dir / "spec.json"
    if stamp.exists() and json.loads(stamp.read_text()) == spec:
        return
    rng = np.random.default_rng(seed)
    truth = rng.standard_normal((count, ELEMENTS))
    ref = truth.astype(np.float32)
    # Test: a reordered kernel's rounding (2^-23 relative), and 1% of the tensors 1e-2 off.
    rel = np.full((count, 1), 2.0**-23)
    rel[rng.random(count) < 0.01] = 1e-2
    test = (truth * (1 + rel * rng.standard_normal((count, ELEMENTS)))).astype(np.float32)
    names = [f"layers.{i // 1000}.t{i % 1000:03d}" for i in range(count)]
    write_trace(out_dir / "truth.safetensors", names, np.float64, truth, "truth")
    write_trace(out_dir / "ref.safetensors", names, np.float32, ref, "ref")
    write_trace(out_dir / "test.safetensors", names, np.float32, test, "test")
    stamp.write_text(json.dumps(spec))


def run(cmd):
    """(seconds, peak RSS in bytes) of one run of cmd (its exit status 0 or 1: a verdict).

    The peak is the process's VmHWM, read every 5 ms until it exits: wait4's ru_maxrss would
    count this Python's own memory, which the child shares until it execs.
    """
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    peak = [0]

    def watch():
        path = f"/proc/{proc.pid}/status"
        while True:
            try:
                with open(path) as f:
                    for line in f:
                        if line.startswith("VmHWM:"):
                            peak[0] = max(peak[0], int(line.split()[1]) * 1024)
            except (OSError, ValueError):
                return  # gone (or a zombie without memory)
            time.sleep(0.005)

    watcher = threading.Thread(target=watch)
    watcher.start()
    _, status = os.waitpid(proc.pid, 0)
    seconds = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    watcher.join()
    err = proc.stderr.read().decode(errors="replace")
    proc.stderr.close()
    if proc.returncode not in (0, 1):
        sys.exit(f"{' '.join(map(str, cmd))} exited {proc.returncode}: {err}")
    return seconds, peak[0]


def human(b):
    for unit in ("B", "KiB", "MiB", "GiB"):
        if b < 1024 or unit == "GiB":
            return f"{b:.0f} {unit}" if unit == "B" else f"{b:.1f} {unit}"
        b /= 1024


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--build", default="build", help="folder with numalign and header_floor")
    p.add_argument("--out", default="build/bench/many_tensors", help="traces and reports")
    p.add_argument("--count", type=int, default=1_000_000, help="tensors per trace")
    p.add_argument("--repeat", type=int, default=3, help="runs per measurement (median)")
    p.add_argument("--formats", default="text,json,html", help="which reports to time")
    p.add_argument("--numalign", default=None, help="the CLI to time (default BUILD/numalign)")
    p.add_argument("--also", default=None,
                   help="a second CLI (an earlier build) timed alongside, its rows marked 'also'")
    a = p.parse_args()
    out = Path(a.out)
    make(a.count, out)
    files = [str(out / f"{r}.safetensors") for r in ("test", "ref", "truth")]
    build = Path(a.build)
    cmds = {"floor": [str(build / "header_floor"), *files]}
    clis = [("", a.numalign or str(build / "numalign"))]
    if a.also:
        clis.append(("also ", a.also))
    for label, cli in clis:
        for fmt in a.formats.split(","):
            ext = {"text": "txt"}.get(fmt, fmt)
            cmds[label + fmt] = [cli, "judge", *files, "--format", fmt,
                                 "-o", str(out / f"report.{label.strip()}{ext}")]
    runs = {k: [] for k in cmds}
    for _ in range(a.repeat):  # alternate, so that a noisy neighbour hits every row alike
        for k, cmd in cmds.items():
            runs[k].append(run(cmd))
    floor = statistics.median(s for s, _ in runs["floor"])
    print(f"{a.count:,} tensors of {ELEMENTS} elements (test/ref F32, truth F64), "
          f"median of {a.repeat}; {machine_description()}")
    print(f"`python bench/many_tensors.py --count {a.count} --repeat {a.repeat}`\n")
    print("| run | seconds | x floor | peak RSS | output |")
    print("|---|---:|---:|---:|---:|")
    for k, rs in runs.items():
        s = statistics.median(x for x, _ in rs)
        rss = statistics.median(x for _, x in rs)
        size = "" if k == "floor" else human(os.path.getsize(cmds[k][-1]))
        # A run too short for a reading of its memory shows "-".
        print(f"| {k} | {s:.2f} | {s / floor:.2f} | {human(rss) if rss else '-'} | {size} |")


if __name__ == "__main__":
    main()
