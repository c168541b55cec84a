"""test_tensor_parallel.py: a tensor-parallel run (one trace per gloo rank, as
numalign.distributed.save writes them) judged against a single-process reference, on 2 and 4
ranks: a column-parallel linear's output and weight gradient are sharded (the ranks' pieces
side by side), a row-parallel linear's weight gradient is sharded along its input dim and its
all-reduced output is replicated (every rank must hold the same). The map says which is
which; Python and the CLI (--ranks N) judge alike; a bug on one rank fails only its tensors."""
import json
import os

import pytest
import torch
import torch.distributed as dist

import numalign
from numalign import distributed

IN, HIDDEN, OUT, TOKENS = 24, 32, 16, 40

MAP = {"map": [
    {"ref": "fc1.out", "sharded_dim": -1},
    {"ref": "grad.param.fc1.weight", "sharded_dim": 0},
    {"ref": "grad.param.fc2.weight", "sharded_dim": 1},
    {"ref": "fc2.out", "replicated": True},
    {"ref": "grad.input.x", "replicated": True}]}


def _weights():
    g = torch.Generator().manual_seed(11)
    return (torch.randn(TOKENS, IN, dtype=torch.float64, generator=g),
            torch.randn(HIDDEN, IN, dtype=torch.float64, generator=g) / 5,
            torch.randn(OUT, HIDDEN, dtype=torch.float64, generator=g) / 6,
            torch.randn(TOKENS, OUT, dtype=torch.float64, generator=g))


def _mlp(x, w1, w2, upstream):
    """fc1 (column-parallel in the TP run), GELU, fc2 (row-parallel): the tensors recorded."""
    x = x.clone().requires_grad_(True)
    w1, w2 = w1.clone().requires_grad_(True), w2.clone().requires_grad_(True)
    h = x @ w1.T
    y = torch.nn.functional.gelu(h) @ w2.T
    y.backward(upstream)
    return {"fc1.out": h.detach(), "fc2.out": y.detach(), "grad.param.fc1.weight": w1.grad,
            "grad.param.fc2.weight": w2.grad, "grad.input.x": x.grad}


def _single(dtype):
    return numalign.Trace(_mlp(*(t.to(dtype) for t in _weights())))


def _tp_rank(out_dir, bug_rank=-1):
    """This rank's shard of the MLP in float32: fc1's rows and fc2's columns; the partial
    outputs of fc2 are all-reduced (its upstream gradient reaches every rank whole)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    x, w1, w2, upstream = (t.float() for t in _weights())
    cols = slice(rank * HIDDEN // world, (rank + 1) * HIDDEN // world)
    w1_r = w1[cols].clone()
    if rank == bug_rank:
        w1_r[0] *= 1.05  # one output column of this rank's shard is 5% off
    x = x.clone().requires_grad_(True)
    w1_r.requires_grad_(True)
    w2_r = w2[:, cols].clone().requires_grad_(True)
    h = x @ w1_r.T
    partial = torch.nn.functional.gelu(h) @ w2_r.T
    partial.backward(upstream)
    y = partial.detach().clone()
    dist.all_reduce(y)
    grad_x = x.grad.clone()
    dist.all_reduce(grad_x)
    trace = {"fc1.out": h.detach(), "fc2.out": y, "grad.param.fc1.weight": w1_r.grad,
             "grad.param.fc2.weight": w2_r.grad, "grad.input.x": grad_x}
    return distributed.save(trace, os.path.join(out_dir, f"tp{bug_rank}.safetensors"))


def _runs(tmp_path, world, bug_rank=-1):
    distributed.spawn(_tp_rank, world, (str(tmp_path), bug_rank), timeout=120)
    return distributed.ranks(tmp_path / f"tp{bug_rank}.safetensors", world)


@pytest.mark.parametrize("world", [2, 4])
def test_shards_and_replicas_against_a_single_process_run(tmp_path, world, cli):
    ref, truth = _single(torch.float32), _single(torch.float64)
    ref.save(tmp_path / "ref.safetensors")
    truth.save(tmp_path / "truth.safetensors")
    ranks = _runs(tmp_path, world)
    report = numalign.judge(ranks, ref, truth, map=MAP)
    assert report.aligned, str(report)
    assert len(report.tensors) == 5
    fc1 = report["grad.param.fc1.weight"]
    assert fc1["test_source"] == f"grad.param.fc1.weight on ranks 0-{world - 1} along dim 0"
    # Without the map every tensor is taken as replicated: the shards differ between ranks.
    plain = numalign.judge(ranks, ref, truth)
    assert plain.exit_code == 1
    assert "replicated, but rank 1 differs from rank 0" in plain["fc1.out"]["reason"]
    assert plain["fc2.out"]["verdict"] == "pass"
    # The CLI reads the ranks as distributed.save named them.
    (tmp_path / "map.json").write_text(json.dumps(MAP))
    proc = cli("judge", tmp_path / "tp-1.safetensors", tmp_path / "ref.safetensors",
               tmp_path / "truth.safetensors", "--ranks", world, "--map", tmp_path / "map.json",
               "--format", "json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    by_name = lambda tensors: sorted(tensors, key=lambda t: t["name"])  # noqa: E731
    assert by_name(json.loads(proc.stdout)["tensors"]) == by_name(report.tensors)
    # A rank's file missing: named, exit 2.
    os.remove(ranks.runs[world - 1])
    proc = cli("judge", tmp_path / "tp-1.safetensors", tmp_path / "ref.safetensors",
               "--ranks", world)
    assert proc.returncode == 2
    assert f"tp-1.rank{world - 1}.safetensors" in proc.stderr


def test_a_bug_on_one_rank_fails_its_shards_only(tmp_path):
    ref, truth = _single(torch.float32), _single(torch.float64)
    report = numalign.judge(_runs(tmp_path, 4, bug_rank=2), ref, truth, map=MAP)
    failing = {t["name"] for t in report.tensors if t["verdict"] != "pass"}
    # fc1's output and everything computed from it downstream; fc2.out is all-reduced, so it
    # is wrong (and equal) on every rank.
    assert "fc1.out" in failing and "fc2.out" in failing, str(report)
    # The worst element against the truth lies in rank 2's columns of fc1's output.
    assert report["fc1.out"]["max_abs_index"][1] // (HIDDEN // 4) == 2, str(report)
