"""judge_sweep.py: the fused all-reduce + residual + RMSNorm sweep on 2 CPU ranks (gloo), judged
on rank 0 with exact, ulp:1, same()'s rule, abs:0.13 and the default rule (measured) against
the float64 truth, summarised by tag."""
from __future__ import annotations

import os
import sys

import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from allreduce import sweep  # noqa: E402

import numalign  # noqa: E402
from numalign import Trace  # noqa: E402
from numalign.distributed import spawn  # noqa: E402

RULES = ("exact", "ulp:1", "same", "abs:0.13", "measured")


def judge_all(runs, tags):
    """{(variant, rule): Report} with every rule on every variant, against unfused."""
    ref = Trace(runs["unfused"], metadata={"order": list(tags), "tags": tags})
    truth = Trace(runs["truth"])
    reports = {}
    for variant in ("fused", "truncating", "sparse_2ulp"):
        for rule in RULES:
            reason = {"*": (rule, "the rule under study")} if rule in ("ulp:1", "abs:0.13") else rule
            reports[variant, rule] = numalign.judge(runs[variant], ref, truth, rules=reason)
        reports[variant, "same+bias"] = numalign.judge(runs[variant], ref, truth, rules="same",
                                                       check_bias=True)
    return reports


RULE_COLUMNS = RULES + ("same+bias",)


def summary(reports, *keys):
    """{variant: {rule: {tag values: (passed, tensors)}}}: the sweep's findings, small."""
    return {variant: {rule: {" ".join(k): (g["passed"], g["tensors"])
                             for k, g in reports[variant, rule].by_tag(*keys).items()}
                      for rule in RULE_COLUMNS}
            for variant in ("fused", "truncating", "sparse_2ulp")}


def table(reports, *keys):
    """Passing cases per variant and rule, one row per value of the tag keys."""
    found = summary(reports, *keys)
    width = max(len(" ".join(keys)), *(len(tag) for by_rule in found.values() for tag in by_rule["exact"])) + 1
    lines = [f"{'variant':<12} {' '.join(keys):<{width}}" + "".join(f"{r:>11}" for r in RULE_COLUMNS)]
    for variant, by_rule in found.items():
        for tag in by_rule["exact"]:
            cells = "".join(f"{'%d/%d' % by_rule[r][tag]:>11}" for r in RULE_COLUMNS)
            lines.append(f"{variant:<12} {tag:<{width}}{cells}")
    return "\n".join(lines)


def report_text(reports):
    worst = next(t for t in reports["fused", "ulp:1"].tensors if t["verdict"] == "fail")
    return "\n\n".join([
        "passing cases (of each tag's cases) per rule, by output and the signs of the operands:",
        table(reports, "output", "signs"),
        "by output and magnitude:",
        table(reports, "output", "magnitude"),
        "and by kernel path:",
        table(reports, "path"),
        f"fused under ulp:1, {worst['name']}: {worst['reason']}"]) + "\n"


def _sweep_text():
    runs, tags = sweep()
    return report_text(judge_all(runs, tags)) if dist.get_rank() == 0 else None


def main():
    print(spawn(_sweep_text, 2)[0], end="")


if __name__ == "__main__":
    main()
