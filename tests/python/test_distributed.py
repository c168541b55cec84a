"""test_distributed.py: numalign.distributed on real torch.distributed process groups (gloo,
CPU, 2 and 4 ranks): replicated tensors checked across ranks, per-rank traces and the
`numalign consistent` CLI on them. Every process group is torn down, even on failure."""
import json
import os
import socket
import traceback

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank, world, port, body, out_dir):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        result = body(rank, world, out_dir)
        with open(os.path.join(out_dir, f"result.{rank}.json"), "w") as f:
            json.dump(result, f)
    except BaseException:
        with open(os.path.join(out_dir, f"error.{rank}.txt"), "w") as f:
            f.write(traceback.format_exc())
        raise
    finally:
        dist.destroy_process_group()


def run_ranks(body, world, tmp_path, timeout=120):
    """Runs body(rank, world, out_dir) on `world` gloo ranks; returns each rank's result."""
    ctx = mp.start_processes(_worker, args=(world, _free_port(), body, str(tmp_path)),
                             nprocs=world, join=False, start_method="spawn")
    try:
        while not ctx.join(timeout=timeout):
            pass
    except Exception:
        errors = sorted(tmp_path.glob("error.*.txt"))
        pytest.fail("a rank failed:\n" + "\n".join(e.read_text() for e in errors))
    return [json.loads((tmp_path / f"result.{r}.json").read_text()) for r in range(world)]


def _weights(rank):
    """A replicated state: the same on every rank but one element of `b` on rank 1, moved 1
    ULP (bf16), and `c` on rank 1 (of 2+) differs by 3 ULP in two places."""
    torch.manual_seed(0)
    state = {"a": torch.randn(64, 8), "b": torch.randn(16, 16).to(torch.bfloat16),
             "c": torch.randn(100, dtype=torch.float64)}
    if rank == 1:
        b = state["b"].view(torch.int16).clone()
        b[3, 5] += 1
        state["b"] = b.view(torch.bfloat16)
        c = state["c"].view(torch.int64).clone()
        c[[7, 40]] += 3
        state["c"] = c.view(torch.float64)
    return state


def _check(rank, world, out_dir):
    from numalign import distributed

    state = _weights(rank)
    exact = distributed.check_consistent(state, "exact")
    ulp1 = distributed.check_consistent(state, "ulp:1")
    path = distributed.save(state, os.path.join(out_dir, "weights.safetensors"))
    # After an all-reduce every rank holds the same sum: consistent.
    g = torch.full((32,), float(rank + 1)) / 3
    dist.all_reduce(g)
    reduced = distributed.check_consistent({"grad": g})
    return {"exact": exact, "ulp1": ulp1, "path": path, "reduced": reduced}


@pytest.mark.parametrize("world", [2, 4])
def test_check_consistent_names_ranks_and_first_differences(tmp_path, world):
    results = run_ranks(_check, world, tmp_path)
    assert all(r["exact"] == results[0]["exact"] for r in results), "every rank gets the report"
    exact = results[0]["exact"]
    assert not exact["consistent"]
    by_name = {t["name"]: t for t in exact["tensors"]}
    assert by_name["a"]["consistent"]
    assert [t["name"] for t in exact["tensors"]][:2] == ["b", "c"], "inconsistent first"
    (b,) = by_name["b"]["differing"]
    assert b["rank"] == 1 and b["elements_differ"] == 1 and b["first_index"] == "(3, 5)"
    assert b["max_ulp"] == 1
    (c,) = by_name["c"]["differing"]
    assert c["first_index"] == "(7,)" and c["elements_differ"] == 2 and c["max_ulp"] == 3
    # ulp:1 lets the 1-ULP difference through, not the 3-ULP one.
    ulp1 = {t["name"]: t for t in results[0]["ulp1"]["tensors"]}
    assert ulp1["b"]["consistent"] and not ulp1["c"]["consistent"]
    assert results[0]["reduced"]["consistent"]
    assert [r["path"] for r in results] == [
        str(tmp_path / f"weights.rank{r}.safetensors") for r in range(world)]


def test_cli_consistent_reads_the_per_rank_traces(tmp_path, cli):
    results = run_ranks(_check, 2, tmp_path)
    p = cli("consistent", *(r["path"] for r in results), "--format", "json")
    assert p.returncode == 1, p.stderr
    cli_report = json.loads(p.stdout)
    py_report = results[0]["exact"]
    # The same findings (the CLI lists tensors in file order, Python in the state's order).
    by_name = {t["name"]: t for t in py_report["tensors"]}
    assert set(by_name) == {t["name"] for t in cli_report["tensors"]}
    for c in cli_report["tensors"]:
        q = by_name[c["name"]]
        assert c["consistent"] == q["consistent"]
        for dc, dq in zip(c["differing"], q["differing"]):
            assert {k: dc[k] for k in ("rank", "elements_differ", "first_index", "max_ulp")} == \
                   {k: dq[k] for k in ("rank", "elements_differ", "first_index", "max_ulp")}
    text = cli("consistent", *(r["path"] for r in results), "--rule", "ulp:1").stdout
    assert "NOT CONSISTENT: 1 of 3 tensors differ from rank 0 on rank(s) 1" in text
    assert "rank 1: 2 element(s) differ, the first at (7,)" in text


def test_cli_consistent_reports_missing_tensors_and_refuses_other_rules(cli, examples):
    a, b = examples / "matmul" / "ref.safetensors", examples / "allreduce" / "fused.safetensors"
    report = json.loads(cli("consistent", a, b, "--format", "json").stdout)
    problems = {t["name"]: t["differing"][0]["problem"] for t in report["tensors"]}
    assert problems["fp32.out"] == "missing"
    assert problems["out.magnitude_1"] == "only on this rank, not on rank 0"
    p = cli("consistent", a, a, "--rule", "abs:1")
    assert p.returncode == 2 and "consistent takes exact or ulp:K" in p.stderr
    p = cli("consistent", a)
    assert p.returncode == 2, "one rank is nothing to compare"
