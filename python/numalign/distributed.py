"""distributed.py: alignment questions on torch.distributed. Each rank works on what it
holds; only small per-tensor results (hashes, counts, first differences) cross ranks, and a
tensor's data moves only when it must be compared element by element."""
from __future__ import annotations

import gc
import hashlib
import os
import pickle
import re
import socket
import tempfile
import time
import traceback

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from . import _core
from ._tensors import flatten
from .report import Report
from .trace import Trace


def _rank_world(group):
    return dist.get_rank(group), dist.get_world_size(group)


def _rank0(group):
    """Rank 0 of ``group`` as a global rank (what gather and broadcast take)."""
    return dist.get_global_rank(group, 0) if group is not None else 0


def judge(test, ref, truth=None, *, group=None, on_all_ranks=False, **options):
    """Each rank judges its own tensors (as ``numalign.judge``, with the same options); only
    the small per-tensor results travel. Rank 0 returns one merged Report whose names carry
    a ``rank<N>/`` prefix (failures worst first across ranks, each rank's warnings and
    first divergence labelled, tags gain ``rank``); the other ranks return None, or the
    same merged Report with ``on_all_ranks=True``."""
    from .api import judge as judge_here

    rank, world = _rank_world(group)
    local = judge_here(test, ref, truth, **options)
    mine = (local._core, local.tags)
    if on_all_ranks:
        parts = [None] * world
        dist.all_gather_object(parts, mine, group=group)
    else:
        parts = [None] * world if rank == 0 else None
        dist.gather_object(mine, parts, dst=_rank0(group), group=group)
        if rank != 0:
            return None
    merged = Report(_core.merge_reports([(f"rank{r}/", core) for r, (core, _) in enumerate(parts)],
                                        f"{world} ranks, each judged on its own tensors"))
    tags = {}
    for t in merged.tensors:  # every tensor gets its rank, tagged in the trace or not
        prefix, _, name = t["name"].partition("/")
        r = int(prefix[len("rank"):])
        tags[t["name"]] = {**parts[r][1].get(name, {}), "rank": str(r)}
    merged.tags = tags
    return merged


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_main(rank, fn, args, world, port, out_dir, backend):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group(backend, rank=rank, world_size=world)
    try:
        result = fn(*args)
        torch.save(result, os.path.join(out_dir, f"result.{rank}.pt"))
    except BaseException:
        with open(os.path.join(out_dir, f"error.{rank}.txt"), "w", encoding="utf-8") as f:
            f.write(traceback.format_exc())
        raise
    finally:
        # What fn built may outlive it in reference cycles (DistributedDataParallel does) and
        # hold the group; freed only at interpreter exit, gloo then aborts the process
        # ("terminate called without an active exception", one run in ten). Free it first.
        gc.collect()
        dist.destroy_process_group()


def spawn(fn, world_size: int, args=(), *, timeout: float = 300.0, backend: str = "gloo"):
    """Runs ``fn(*args)`` in ``world_size`` fresh processes that form one process group
    (``backend``, on this machine) and returns their return values in rank order. ``fn``
    must be importable by name (a module-level function): the processes are spawned. A
    rank that raises fails the call with its traceback; past ``timeout`` seconds every rank
    is stopped and TimeoutError raised. The group is torn down on every rank either way."""
    name = getattr(fn, "__name__", repr(fn))
    try:  # what the spawned processes receive, checked here for a clear message
        pickle.dumps((fn, tuple(args)))
    except (pickle.PicklingError, AttributeError, TypeError) as e:
        raise TypeError(f"spawn({name}): the function and its arguments go to fresh processes, "
                        f"so they must be importable by name (module-level functions, or "
                        f"functools.partial of them; no lambdas or local functions): {e}") from None
    with tempfile.TemporaryDirectory(prefix="numalign-ranks-") as out:
        ctx = mp.start_processes(_rank_main, args=(fn, tuple(args), world_size, _free_port(), out, backend),
                                 nprocs=world_size, join=False, start_method="spawn")
        deadline = time.monotonic() + timeout
        try:
            while not ctx.join(timeout=max(0.1, min(5.0, deadline - time.monotonic()))):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{world_size} rank(s) of {name} "
                                       f"still running after {timeout:g} s")
        except (mp.ProcessRaisedException, mp.ProcessExitedException) as e:
            failed = sorted(f for f in os.listdir(out) if f.startswith("error."))
            detail = "\n".join(open(os.path.join(out, f), encoding="utf-8").read() for f in failed)
            raise RuntimeError(f"a rank of {name} failed:\n{detail or e}") from None
        finally:
            for p in ctx.processes:
                if p.is_alive():
                    p.kill()
                    p.join()
        # Written by our own ranks into our own directory: not untrusted input.
        return [torch.load(os.path.join(out, f"result.{r}.pt"), weights_only=False)
                for r in range(world_size)]


def rank_path(path, rank: int | None = None, group=None) -> str:
    """``trace.safetensors`` -> ``trace.rank<N>.safetensors`` for this (or the given) rank."""
    if rank is None:
        rank = dist.get_rank(group)
    root, ext = os.path.splitext(os.fspath(path))
    return f"{root}.rank{rank}{ext or '.safetensors'}"


def save(trace, path, group=None) -> str:
    """Saves this rank's trace (a Trace or {name: tensor}) as ``path`` with ``.rank<N>``
    before the extension, with the rank and world size in its metadata; returns the path."""
    rank, world = _rank_world(group)
    t = trace if isinstance(trace, Trace) else Trace(flatten(trace))
    t.metadata = {**t.metadata, "rank": rank, "world_size": world}
    out = rank_path(path, rank)
    t.save(out)
    return out


def _bits(t: torch.Tensor) -> torch.Tensor:
    """The elements as unsigned integers of their width, for bitwise comparison."""
    t = t.detach().cpu().contiguous().reshape(-1)
    width = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()]
    return t.view(width)


def _digest(t: torch.Tensor) -> str:
    h = hashlib.sha256(f"{t.dtype}|{tuple(t.shape)}|".encode())
    if t.numel():
        h.update(_bits(t).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def check_consistent(tensors, rule: str = "exact", group=None) -> dict:
    """On every rank of ``group``: do the tensors that must be replicated (a dict, a module's
    state, any nested structure) agree with rank 0's, bitwise (``"exact"``) or within
    ``"ulp:K"``? Returns, on every rank, the same dict as ``numalign consistent
    --format json``: ``{"consistent", "rule", "tensors": [{"name", "consistent",
    "differing": [{"rank", "elements_differ", "first_index", "value", "rank0_value",
    "max_ulp"} or {"rank", "problem"}]}]}``, inconsistent tensors first."""
    from .api import judge

    if not re.fullmatch(r"exact|ulp:\d+", rule):
        raise ValueError(f"rule {rule!r}: check_consistent takes 'exact' or 'ulp:K'")
    rank, world = _rank_world(group)
    mine = {n: t for n, t in flatten(tensors).items() if isinstance(t, torch.Tensor)}
    # Round 1: names, dtypes, shapes and digests, all small.
    summary = {n: (str(t.dtype), tuple(t.shape), _digest(t)) for n, t in mine.items()}
    summaries = [None] * world
    dist.all_gather_object(summaries, summary, group=group)
    names = list(summaries[0])
    # Round 2: rank 0 sends the tensors some rank holds differently (same dtype and shape).
    to_compare = [n for n in names if any(
        n in s and s[n] != summaries[0][n] and s[n][:2] == summaries[0][n][:2] for s in summaries[1:])]
    results = {}
    for n in to_compare:
        ref = mine[n].detach().cpu().contiguous().clone() if rank == 0 else torch.empty(
            summaries[0][n][1], dtype=getattr(torch, summaries[0][n][0].replace("torch.", "")))
        dist.broadcast(ref, src=_rank0(group), group=group)
        if rank == 0 or n not in mine or summary[n] == summaries[0][n]:
            continue
        local = mine[n].detach().cpu()
        differ = (_bits(local) != _bits(ref)).nonzero()
        first = int(differ[0]) if len(differ) else 0
        # The core measures the ULP distance; the rule, given as an override with its
        # reason, also covers a loosened ulp:K.
        r = judge({n: local}, {n: ref}, rules={"*": (rule, "replicated across ranks")})[n]
        results[n] = {"rank": rank, "elements_differ": len(differ),
                      "first_index": _core.format_index(list(local.shape), first),
                      "value": local.reshape(-1)[first].item(),
                      "rank0_value": ref.reshape(-1)[first].item(), "max_ulp": r["max_ulp"],
                      "within_rule": r["verdict"] == "pass" and rule != "exact"}
    # Round 3: every rank's findings, gathered (small).
    findings = [None] * world
    dist.all_gather_object(findings, results, group=group)
    report = []
    for n in names + sorted({m for s in summaries[1:] for m in s} - set(names)):
        differing = []
        for r in range(1, world):
            s = summaries[r]
            if n not in summaries[0]:
                if n in s:
                    differing.append({"rank": r, "problem": "only on this rank, not on rank 0"})
            elif n not in s:
                differing.append({"rank": r, "problem": "missing"})
            elif s[n][0] != summaries[0][n][0]:
                differing.append({"rank": r, "problem": f"dtype {s[n][0]}, rank 0 has {summaries[0][n][0]}"})
            elif s[n][1] != summaries[0][n][1]:
                differing.append({"rank": r, "problem": f"shape {list(s[n][1])}, rank 0 has {list(summaries[0][n][1])}"})
            elif n in findings[r] and not findings[r][n]["within_rule"]:
                d = dict(findings[r][n])
                del d["within_rule"]
                differing.append(d)
        report.append({"name": n, "consistent": not differing, "differing": differing})
    report.sort(key=lambda t: t["consistent"])  # stable: inconsistent first, order kept
    return {"consistent": all(t["consistent"] for t in report), "rule": rule, "tensors": report}
