"""numalign's benchmark: judging traces against the machine's limit and against PyTorch.

For each workload and dtype, on the same three files (test, ref, float64 truth):
  (a) read_limit    a plain multithreaded read of the mmapped bytes, warm page cache
                    (settled first: see settle_page_cache)
  (b) numalign CLI  `numalign judge` end to end, as a process, warm cache
  (c) PyTorch       safetensors.torch.load_file of the three files and
                    torch._dynamo.utils.same(ref, test, fp64_ref=truth) per tensor
  (d) in memory     numalign.judge on the loaded torch tensors vs the same() loop alone
GB/s are bytes of the three inputs over wall time. Writes results.json, results.md and
plot.svg to --out. Usage: python bench/bench.py --build build --out build/bench [--scale S]
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import make_workload  # noqa: E402
from machine import machine_description  # noqa: E402
import plot  # noqa: E402

# Runs inside a fresh interpreter per measurement, so neither side sees the other's caches.
TORCH_SIDE = r"""
import json, sys, time
import torch
import torch._dynamo.utils as dynamo_utils
from safetensors.torch import load_file
import numalign
threads, paths = int(sys.argv[1]), sys.argv[2:5]
torch.set_num_threads(threads)
start = time.perf_counter()
test, ref, truth = (load_file(p) for p in paths)
loaded = time.perf_counter()
try:
    same_ok = all(dynamo_utils.same(ref[k], test[k], fp64_ref=truth[k], tol=1e-4) for k in ref)
    same_error = None
except Exception as e:  # fp8: torch has no arithmetic for it
    same_ok, same_error = None, f"{type(e).__name__}: {e}"
same_done = time.perf_counter()
report = numalign.judge(test, ref, truth, tol=1e-4, threads=threads)
judged = time.perf_counter()
print(json.dumps({"load_s": loaded - start, "same_s": same_done - loaded,
                  "judge_s": judged - same_done, "same_ok": same_ok, "same_error": same_error,
                  "judge_ok": bool(report.aligned)}))
"""


def median_run(runs, key):
    """The run with the median `key` (for an even count, the lower of the middle two)."""
    return sorted(runs, key=key)[(len(runs) - 1) // 2]


def read_limit(build, files, threads):
    out = subprocess.run([str(build / "read_limit"), str(threads), *map(str, files)],
                         check=True, capture_output=True, text=True).stdout
    return json.loads(out)["seconds"]


def status_kib(pid, keys):
    """The given /proc/PID/status fields in KiB (empty once the process has exited)."""
    found = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                key = line.split(":", 1)[0]
                if key in keys:
                    found[key] = int(line.split()[1])
    except OSError:
        pass
    return found


def run_cli(build, files, threads):
    """Wall time, peak RssAnon and VmHWM (polled from /proc every millisecond) of one CLI
    run. (wait4's ru_maxrss would count the forking Python's own pages.)"""
    cmd = [str(build / "numalign"), "judge", *map(str, files), "--no-progress",
           "--threads", str(threads), "-o", os.devnull]
    with tempfile.TemporaryFile() as err:
        start = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err)
        peak = {"RssAnon": 0, "VmHWM": 0}
        while True:
            pid, status, _ = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            for key, kib in status_kib(proc.pid, peak.keys()).items():
                peak[key] = max(peak[key], kib)
            time.sleep(0.001)
        seconds = time.perf_counter() - start
        proc.returncode = os.waitstatus_to_exitcode(status)
        if proc.returncode not in (0, 1):  # 0 aligned, 1 not aligned, 2 could not judge
            err.seek(0)
            raise RuntimeError(f"{' '.join(cmd)} exited {proc.returncode}: {err.read().decode()}")
    return {"seconds": seconds, "rss_anon_kib": peak["RssAnon"], "vm_hwm_kib": peak["VmHWM"],
            "aligned": proc.returncode == 0}


def run_torch_side(files, threads):
    out = subprocess.run([sys.executable, "-c", TORCH_SIDE, str(threads), *map(str, files)],
                         check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def kernel_bench(build, quick):
    cmd = [str(build / "kernel_bench"), "--benchmark_format=json"]
    if quick:
        cmd += ["--benchmark_filter=/65536", "--benchmark_min_time=0.01"]
    data = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
    rows = []
    for b in data["benchmarks"]:
        _, dtype, size = b["name"].split("/")[:3]
        rows.append({"dtype": dtype, "elements": int(size), "target": b.get("label", ""),
                     "gbps": b["bytes_per_second"] / 1e9})
    return rows


def settle_page_cache(files):
    """Leave each file in the page cache as a cold sequential read leaves it.

    The writer's cache is mostly small folios, mapped a 4 KiB page at a time; a file read back
    by readahead sits in large folios that map a 2 MiB PMD at once. Mapping and unmapping then
    cost a tenth as much, which moves (a) and (b) by up to a third and not by the same amount.
    Dropping the clean pages and reading each file once makes every run start from that one
    state, whoever wrote the files and however long ago."""
    for f in files:
        fd = os.open(f, os.O_RDONLY)
        try:
            os.fsync(fd)  # dirty pages would stay behind DONTNEED
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
            while os.read(fd, 1 << 23):
                pass
        finally:
            os.close(fd)


def measure(build, files, repeat, torch_repeat, settle):
    nbytes = sum(f.stat().st_size for f in files)
    if settle:
        settle_page_cache(files)
    read_limit(build, files, 2)  # warm the page cache
    r = {"bytes": nbytes}
    for t in (1, 2):
        # (a) and (b) alternate, so that both see the machine in the same state.
        reads, clis = [], []
        for _ in range(repeat):
            reads.append(read_limit(build, files, t))
            clis.append(run_cli(build, files, t))
        cli = median_run(clis, key=lambda c: c["seconds"])
        r[f"read_{t}t_s"] = statistics.median(reads)
        r[f"cli_{t}t_s"] = cli["seconds"]
        r[f"read_{t}t_runs_s"] = reads
        r[f"cli_{t}t_runs_s"] = [c["seconds"] for c in clis]
        r[f"cli_{t}t_rss_anon_kib"] = max(c["rss_anon_kib"] for c in clis)
        r[f"cli_{t}t_vm_hwm_kib"] = max(c["vm_hwm_kib"] for c in clis)
        r["cli_aligned"] = cli["aligned"]
    torch_runs = [run_torch_side(files, 2) for _ in range(torch_repeat)]
    torch_side = median_run(torch_runs, key=lambda x: x["load_s"] + x["same_s"])
    r.update({f"torch_{k}": v for k, v in torch_side.items()})
    return r


def derive(r):
    gb = r["bytes"] / 1e9
    same_ran = r["torch_same_error"] is None
    d = {
        "gb": gb,
        "a_1t": gb / r["read_1t_s"], "a_2t": gb / r["read_2t_s"],
        "b_1t": gb / r["cli_1t_s"], "b_2t": gb / r["cli_2t_s"],
        "c": gb / (r["torch_load_s"] + r["torch_same_s"]) if same_ran else None,
        "d_judge": gb / r["torch_judge_s"],
        "d_same": gb / r["torch_same_s"] if same_ran else None,
    }
    d["b_over_a"] = d["b_2t"] / d["a_2t"]
    pairs = [a / b for a, b in zip(r["read_2t_runs_s"], r["cli_2t_runs_s"])]
    d["b_over_a_range"] = (min(pairs), max(pairs))
    d["b_over_a_1t"] = d["b_1t"] / d["a_1t"]
    d["b_vs_c"] = d["b_2t"] / d["c"] if same_ran else None
    d["d_vs_same"] = d["d_judge"] / d["d_same"] if same_ran else None
    d["scaling"] = r["cli_1t_s"] / r["cli_2t_s"]
    d["rss_anon_mib"] = max(r["cli_1t_rss_anon_kib"], r["cli_2t_rss_anon_kib"]) / 1024
    d["vm_hwm_mib"] = max(r["cli_1t_vm_hwm_kib"], r["cli_2t_vm_hwm_kib"]) / 1024
    return d


def fmt(value, spec, suffix=""):
    return "n/a" if value is None else f"{value:{spec}}{suffix}"


def table(results, kernels, machine, command, settled):
    cache = ("dropped and read back once per workload (see settle_page_cache)" if settled
             else "as the writer left it (--as-written)")
    lines = [f"Machine: {machine}", "", f"Command: `{command}`", "", f"Page cache: {cache}.", "",
             "GB/s = bytes of test + ref + truth / wall time; (a) read limit, (b) numalign "
             "CLI, (c) load_file + same() per tensor, (d) numalign.judge vs same() on the same "
             "in-memory tensors. Threads: 2 unless marked 1t. Times are medians; (b)/(a) also "
             "gives the range over the alternating runs.", "",
             "| workload | dtype | GB | (a) 1t | (a) | (b) 1t | (b) | (b)/(a) | (b) 2t/1t "
             "| (c) | (b)/(c) | (d) judge | (d) same() | (d) speed-up | RssAnon MiB "
             "| VmHWM MiB |",
             "|" + "---|" * 16]
    for key, r in results.items():
        d = r["derived"]
        lines.append(
            f"| {r['workload']} | {r['dtype']} | {d['gb']:.2f} | {d['a_1t']:.2f} | "
            f"{d['a_2t']:.2f} | {d['b_1t']:.2f} | {d['b_2t']:.2f} | {d['b_over_a']:.2f} "
            f"({d['b_over_a_range'][0]:.2f}-{d['b_over_a_range'][1]:.2f}) | "
            f"{d['scaling']:.2f} | {fmt(d['c'], '.3f')} | {fmt(d['b_vs_c'], '.1f', 'x')} | "
            f"{d['d_judge']:.2f} | {fmt(d['d_same'], '.3f')} | {fmt(d['d_vs_same'], '.1f', 'x')} "
            f"| {d['rss_anon_mib']:.1f} | {d['vm_hwm_mib']:.0f} |")
    for r in results.values():
        if r["raw"]["torch_same_error"]:
            lines.append(f"\n{r['workload']} {r['dtype']}: same() failed "
                         f"({r['raw']['torch_same_error']}), so (c) and (d) same() are n/a.")
    lines += ["", "Kernel (Google Benchmark, one thread, F64 truth):", "",
              "| dtype | elements | target | GB/s |", "|---|---|---|---|"]
    for k in kernels:
        lines.append(f"| {k['dtype']} | {k['elements']} | {k['target']} | {k['gbps']:.2f} |")
    return "\n".join(lines) + "\n"


def atomic_write(path, text):
    tmp = path.with_name("." + path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--build", default="build", help="folder with numalign, read_limit, kernel_bench")
    p.add_argument("--out", default="build/bench", help="where results and plot go")
    p.add_argument("--data", default=None, help="where workloads are written (default OUT/data)")
    p.add_argument("--scale", type=float, default=1.0, help="workload size factor (1 = full)")
    p.add_argument("--dtypes", default="bf16", help="comma list for the model workload")
    p.add_argument("--repeat", type=int, default=5, help="runs per measurement (median)")
    p.add_argument("--torch-repeat", type=int, default=1, help="runs of the PyTorch side")
    p.add_argument("--as-written", action="store_true",
                   help="measure the page cache as the writer left it (default: drop it and "
                        "read each file once, as after a cold read)")
    a = p.parse_args()
    build, out = Path(a.build), Path(a.out)
    data = Path(a.data) if a.data else out / "data"
    out.mkdir(parents=True, exist_ok=True)
    plan = [("model", dt) for dt in a.dtypes.split(",")] + [("many_small", "bf16")]
    results = {}
    for workload, dtype in plan:
        folder = make_workload.make(workload, dtype, a.scale, data / f"{workload}_{dtype}")
        files = [folder / f"{n}.safetensors" for n in ("test", "ref", "truth")]
        print(f"== {workload} {dtype}: {sum(f.stat().st_size for f in files) / 1e9:.2f} GB",
              flush=True)
        r = measure(build, files, a.repeat, a.torch_repeat, settle=not a.as_written)
        results[f"{workload}_{dtype}"] = {"workload": workload, "dtype": dtype, "raw": r,
                                          "derived": derive(r)}
        d = results[f"{workload}_{dtype}"]["derived"]
        print(f"   (a) {d['a_2t']:.2f} GB/s  (b) {d['b_2t']:.2f} GB/s = {d['b_over_a']:.2f} x (a)"
              f"  (c) {fmt(d['c'], '.3f')} GB/s  (d) {fmt(d['d_vs_same'], '.1f')}x same()",
              flush=True)
    kernels = kernel_bench(build, quick=a.scale < 0.1)
    command = "python bench/bench.py " + " ".join(sys.argv[1:])
    machine = machine_description()
    atomic_write(out / "results.json", json.dumps(
        {"machine": machine, "command": command, "scale": a.scale,
         "page_cache": "as-written" if a.as_written else "settled", "workloads": results,
         "kernel": kernels}, indent=2))
    atomic_write(out / "results.md", table(results, kernels, machine, command, not a.as_written))
    atomic_write(out / "plot.svg", plot.svg(results, kernels))
    print(f"wrote {out / 'results.md'}, results.json and plot.svg")


if __name__ == "__main__":
    main()
