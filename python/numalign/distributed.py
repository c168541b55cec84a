"""distributed.py: alignment questions on torch.distributed. Each rank works on what it
holds; only small per-tensor results (hashes, counts, first differences) cross ranks, and a
tensor's data moves only when it must be compared element by element."""
from __future__ import annotations

import gc
import json
import os
import pickle
import socket
import tempfile
import time
import traceback

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from . import _core
from ._tensors import fingerprint, flatten, to_core, torch_dtype
from .api import Ranks
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
    local = judge_here(test, ref, truth, **options)._core
    if on_all_ranks:
        parts = [None] * world
        dist.all_gather_object(parts, local, group=group)
    else:
        parts = [None] * world if rank == 0 else None
        dist.gather_object(local, parts, dst=_rank0(group), group=group)
        if rank != 0:
            return None
    return Report(_core.merge_reports([(f"rank{r}/", core, {"rank": str(r)})
                                       for r, core in enumerate(parts)],
                                      f"{world} ranks, each judged on its own tensors"))


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
    return _core.rank_trace_path(os.fspath(path), rank)


def ranks(path, world_size: int) -> Ranks:
    """The test run that ``save(trace, path)`` wrote on ``world_size`` ranks, for
    ``numalign.judge(ranks(path, N), ref, truth, map=...)`` (the CLI: ``--ranks N``)."""
    return Ranks([rank_path(path, r) for r in range(world_size)])


def save(trace, path, group=None) -> str:
    """Saves this rank's trace (a Trace or {name: tensor}) as ``path`` with ``.rank<N>``
    before the extension, with the rank and world size in its metadata; returns the path."""
    rank, world = _rank_world(group)
    t = trace if isinstance(trace, Trace) else Trace(flatten(trace))
    t.metadata = {**t.metadata, "rank": rank, "world_size": world}
    out = rank_path(path, rank)
    t.save(out)
    return out


def check_consistent(tensors, rule: str = "exact", group=None) -> dict:
    """On every rank of ``group``: do the tensors that must be replicated (a dict, a module's
    state, any nested structure) agree with rank 0's, bitwise (``"exact"``) or within
    ``"ulp:K"``? Returns, on every rank, the same dict as ``numalign consistent
    --format json`` (its ``files`` are ``"rank N"``): ``{"consistent", "rule", "files",
    "tensors": [{"name", "consistent", "differing": [{"rank", "elements_differ",
    "first_index", "value", "rank0_value", "max_ulp"} or {"rank", "problem"}]}]}``,
    inconsistent tensors first. Only fingerprints and findings travel, and the tensors some
    rank holds differently; the core measures and writes the report."""
    if _core.rule_kind(rule, "check_consistent") not in ("exact", "ulp"):
        raise ValueError(f"rule {rule!r}: check_consistent takes 'exact' or 'ulp:K'")
    rank, world = _rank_world(group)
    mine = {n: t.detach().cpu() for n, t in flatten(tensors).items() if isinstance(t, torch.Tensor)}
    # Round 1: names, dtypes, shapes and fingerprints, all small.
    summary = [(n, to_core(t, n)[0], list(t.shape), fingerprint(t)) for n, t in mine.items()]
    summaries = [None] * world
    dist.all_gather_object(summaries, summary, group=group)
    # Round 2: rank 0 sends the tensors some rank holds differently; each such rank measures.
    rank0 = {n: (dtype, shape) for n, dtype, shape, _ in summaries[0]}
    measured = []
    for n in _core.tensors_to_compare(summaries):
        ref = mine[n].contiguous().clone() if rank == 0 else torch.empty(
            rank0[n][1], dtype=torch_dtype(rank0[n][0]))
        dist.broadcast(ref, src=_rank0(group), group=group)
        if rank != 0 and n in mine:
            d = _core.compare_with_rank0(to_core(mine[n], n), to_core(ref, n), rank, n)
            if d is not None:
                measured.append((n, d))
    # Round 3: every rank's findings, gathered (small); the report is built the same everywhere.
    findings = [None] * world
    dist.all_gather_object(findings, measured, group=group)
    return json.loads(_core.consistency_report(summaries, [m for f in findings for m in f], rule,
                                               [f"rank {r}" for r in range(world)]))
