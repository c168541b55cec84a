"""judge_sweep.py: the fused all-reduce sweep on 2 CPU ranks (gloo), judged on rank 0 with exact,
ulp:1, rmse and abs:0.13 against the float64 truth, summarised by tag."""
from __future__ import annotations

import os
import socket
import sys

import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from allreduce import sweep  # noqa: E402

import numalign  # noqa: E402
from numalign import Trace  # noqa: E402

RULES = ("exact", "ulp:1", "rmse", "abs:0.13")


def judge_all(runs, tags):
    """{(variant, rule): Report} with every rule on every variant, against unfused."""
    ref = Trace(runs["unfused"], metadata={"order": list(tags), "tags": tags})
    truth = Trace(runs["truth"])
    reports = {}
    for variant in ("fused", "truncating", "sparse_2ulp"):
        for rule in RULES:
            reason = {"*": (rule, "the rule under study")} if rule not in ("exact", "rmse") else rule
            reports[variant, rule] = numalign.judge(runs[variant], ref, truth, rules=reason)
        reports[variant, "rmse+bias"] = numalign.judge(runs[variant], ref, truth, check_bias=True)
    return reports


RULE_COLUMNS = RULES + ("rmse+bias",)


def summary(reports, *keys):
    """{variant: {rule: {tag values: (passed, tensors)}}}: the sweep's findings, small."""
    return {variant: {rule: {" ".join(k): (g["passed"], g["tensors"])
                             for k, g in reports[variant, rule].by_tag(*keys).items()}
                      for rule in RULE_COLUMNS}
            for variant in ("fused", "truncating", "sparse_2ulp")}


def table(reports, *keys):
    """Passing cases per variant and rule, one row per value of the tag keys."""
    found = summary(reports, *keys)
    lines = [f"{'variant':<12} {' '.join(keys):<12}" + "".join(f"{r:>11}" for r in RULE_COLUMNS)]
    for variant, by_rule in found.items():
        for tag in by_rule["exact"]:
            cells = "".join(f"{'%d/%d' % by_rule[r][tag]:>11}" for r in RULE_COLUMNS)
            lines.append(f"{variant:<12} {tag:<12}{cells}")
    return "\n".join(lines)


def report_text(reports):
    worst = next(t for t in reports["fused", "ulp:1"].tensors if t["verdict"] == "fail")
    return "\n\n".join([
        "passing cases (of each tag's cases) per rule, by the signs of the operands:",
        table(reports, "signs"),
        "and by kernel path and magnitude:",
        table(reports, "path", "magnitude"),
        f"fused under ulp:1, {worst['name']}: {worst['reason']}"]) + "\n"


def _rank(rank, world, port, out):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        runs, tags = sweep()
        if rank == 0:
            with open(out, "w") as f:
                f.write(report_text(judge_all(runs, tags)))
    finally:
        dist.destroy_process_group()


def main():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = os.path.abspath("allreduce_fusion.txt")
    mp.start_processes(_rank, args=(2, port, out), nprocs=2, start_method="spawn")
    print(open(out).read(), end="")


if __name__ == "__main__":
    main()
