"""print_names.py: the tensor names numalign's trace_model records for the two
implementations (HF's Llama, the reference; FusedLlama, the test), and whether map.json
pairs them completely and rightly, as the core's map decides it.

    python examples/two_implementations/print_names.py [--layers N] [--names] [--map MAP]

The map is checked by judging the two implementations' float64 runs through it
(``numalign.judge(fused_f64, hf_f64, map=...)``, the matching done by the core, src/map.cpp;
nothing of it is re-implemented here), and the report's pairing problems are printed: ref
tensors "not mapped", test tensors "only in test", entries that matched no tensor, what the
ignores leave out and why, reasons the run could not be judged, and pairs that disagree.
Exit 0 when the map is complete and every pair agrees, else 1.

The rule, ``abs:1e-10`` (max |test - ref| <= 1e-10), and no truth: both runs are float64, so
there is nothing more accurate to measure either against; the two implementations differ
only in the order of their sums (a fused projection's backward pass sums its gradients in
another order), which in float64 moves a tensor by a few units of 2^-52 of its magnitude.
Measured on this model: the forward pass is bit for bit HF's where the BLAS computes a fused
projection's thirds as three projections (MKL on an Intel Xeon; on an AMD EPYC it differs by
up to 2.8e-16), the backward pass differs by at most 2.9e-14 (relative L2 at most 7.4e-16) on tensors up to about 80 in magnitude. A
wrong pairing, a piece cut from the wrong place or a missing transpose is off by the
tensor's own magnitude (1e-2 or more here). ``ulp:K`` would not do: where a gradient's
element is a sum that cancels to near zero, a difference of 1e-17 is thousands of ULPs of
that element (35,000 here); ``exact`` fails the reordered sums. The core has no relative
rule, so 1e-10 is about 1e-12 of the largest tensors' magnitude (~100) and a looser bound
on the smallest (1e-8 relative at 1e-2), still 10^6 below a wrong pairing."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import fused_llama  # noqa: E402

MAP_PATH = HERE / "map.json"
FLOAT64_RULE = "abs:1e-10"


def traces(layers: int = 2, dtype=torch.float64, bug=None):
    """(test, ref): trace_model of FusedLlama and of HF's Llama, every module recorded.
    ``bug``: (layer, part) to plant in the test model (fused_llama.plant_bug)."""
    from numalign.capture import trace_model

    ref_model = fused_llama.reference_llama(layers)
    test_model = fused_llama.from_hf(ref_model)
    if bug is not None:
        fused_llama.plant_bug(test_model, *bug)
    x = fused_llama.example_inputs()
    return trace_model(test_model, x, dtype), trace_model(ref_model, x, dtype)


def judge_float64(test, ref, mapping=MAP_PATH):
    """The core's judgement of FusedLlama's float64 run against HF's through the map
    (``mapping``: a path, or a dict in the map file's format)."""
    import numalign

    return numalign.judge(test, ref, map=mapping if isinstance(mapping, dict) else str(mapping),
                          rules=FLOAT64_RULE)


def pairing_problems(report) -> list:
    """What the report says is wrong with the map's pairing, one line each: ref tensors that
    could not be judged ("not mapped": no entry maps them; two entries map them; a piece
    whose shape does not fit), test tensors nothing used, entries that matched nothing, why
    the run could not be judged. (What the ignores leave out is not a problem: it is listed
    with its reason.)"""
    problems = [f"{t['name']}: {t['reason']}" for t in report.tensors if t["verdict"] == "error"]
    problems += [w for w in report.warnings
                 if "only in test" in w or "matched no tensor" in w]
    problems += [f"could not judge: {why}" for why in report.could_not_judge]
    return problems


def disagreeing(report) -> list:
    """The pairs judged that disagree (those that could not be judged: pairing_problems)."""
    return [t for t in report.tensors if t["verdict"] == "fail"]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--names", action="store_true", help="list every recorded name")
    ap.add_argument("--map", default=str(MAP_PATH))
    args = ap.parse_args(argv)
    test, ref = traces(args.layers)
    if args.names:
        for title, trace in (("reference (HF LlamaForCausalLM)", ref), ("test (FusedLlama)", test)):
            print(f"{title}: {len(trace)} tensors")
            for n in trace.metadata["order"]:
                print(f"  {n}  {tuple(trace[n].shape)}")
    report = judge_float64(test, ref, args.map)
    print(f"map {args.map}: {report.summary['tensors']} ref tensors judged in float64, "
          f"{report.summary['passed']} agree ({FLOAT64_RULE})")
    for w in report.warnings:
        if w.startswith("the map leaves out"):
            print(f"  {w}")
    problems = pairing_problems(report)
    for p in problems:
        print(f"pairing: {p}")
    wrong = disagreeing(report)
    for t in wrong:
        print(f"disagrees: {t['name']} (test {t.get('test_source') or t['name']}): {t['reason']}")
    ok = not problems and not wrong and report.aligned
    print("complete, every pair agrees" if ok else "INCOMPLETE or WRONG")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
