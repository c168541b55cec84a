"""isolate_bench.py: what capture.isolate costs against the three trace_model runs (truth, ref,
test) it stands beside (issue 23, item 4). On an HF Llama built from a config (default: 12
layers, hidden 256, batch 2 x 128 tokens, bf16), each measured in turn, alternating, medians
of --repeat runs:

    three_traces   trace_model of the truth (float64), the ref and the test (bf16), in memory;
    isolate        capture.isolate(test, ref, inputs, bf16) (its report included);
    forward_backward  one plain forward + backward in bf16 (the unit of work).

It also counts the work isolate does by design: every selected module call is rerun on its
own for each of the three roles, so a module nested d levels deep runs d + 1 times per role
(its own run and each enclosing module's); the sum over calls of their parameters' share of
the model tells how many model passes that is.

Then isolate's pieces, alternating, medians: the float64 run that records every call
(`record`), each role's reruns (`truth`, `ref`, `test`), the judgement (`judge`), and an
experiment: the truth's reruns without the float64 watch (`truth_unwatched`: float64 by
default, no op-by-op dispatch mode, so parts the model computes below float64 stay there),
about the float64 compute alone. `record + truth_unwatched + ref + test + judge` is what
isolate's reruns cost with no watch and no overhead around them.

    python bench/isolate_bench.py [--layers 12 --hidden 256 --batch 2 --tokens 128 --repeat 3]
"""
from __future__ import annotations

import contextlib
import copy
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from capture_bench import llama, model_arguments, plain_step, time_alternating  # noqa: E402
from numalign import _precision, capture, isolation  # noqa: E402
from numalign._runs import selected_modules  # noqa: E402
from numalign.api import _judge  # noqa: E402


def model_passes(model) -> float:
    """Parameters run per role by isolate, over the model's parameters: the model passes
    (forward + backward) isolate's design costs per role, counting by weights."""
    total = sum(p.numel() for p in model.parameters())
    run = sum(sum(p.numel() for p in m.parameters()) for _, m in selected_modules(model, None)
              if not isinstance(m, torch.nn.ModuleList))
    return run / total


def main() -> None:
    args = model_arguments(__doc__.split("\n\n")[0], layers=12, hidden=256, vocab=4000,
                           tokens=128)
    dtype = getattr(torch, args.dtype)
    ref = llama(args.layers, args.hidden, args.vocab)
    test = copy.deepcopy(ref)
    with torch.no_grad():  # a planted bug, so that the report has something to rank
        test.model.layers[args.layers // 2].mlp.down_proj.weight.mul_(1.01)
    inputs, forward_backward = plain_step(ref, args, dtype)

    def three_traces():
        for model, d in ((ref, torch.float64), (ref, dtype), (test, dtype)):
            capture.trace_model(model, inputs, d)

    variants = {"forward_backward": forward_backward, "three_traces": three_traces,
                "isolate": lambda: capture.isolate(test, ref, inputs, dtype)}
    median = time_alternating(variants, args.repeat)
    print(f"HF Llama, {args.layers} layers, hidden {args.hidden}, batch {args.batch} x "
          f"{args.tokens}, {args.dtype} (truth float64), torch threads {torch.get_num_threads()}; "
          f"median of {args.repeat}")
    print("| variant | seconds | vs three_traces |")
    print("| --- | ---: | ---: |")
    for v in variants:
        print(f"| {v} | {median[v]:.3f} | {median[v] / median['three_traces']:.2f}x |")
    print(f"\nisolate reruns {model_passes(ref):.1f} model passes (by parameters) per role, "
          "by design: each module call on its own, nested ones inside each enclosing one")
    pieces = isolate_pieces(ref, test, inputs, dtype, args.repeat)
    print("\n| piece of isolate | seconds | vs three_traces |")
    print("| --- | ---: | ---: |")
    for v, t in pieces.items():
        print(f"| {v} | {t:.3f} | {t / median['three_traces']:.2f}x |")
    least = sum(pieces[v] for v in ("record", "truth_unwatched", "ref", "test", "judge"))
    print(f"| record + truth_unwatched + ref + test + judge | {least:.3f} | "
          f"{least / median['three_traces']:.2f}x |")


@contextlib.contextmanager
def _float64_unwatched(model, mode):
    """_precision.float64_truth without its dispatch mode: float64 by default, nothing
    watched or raised (an experiment: what the truth's float64 compute costs alone)."""
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        yield {"mode": mode, "below_float64": {}, "raised": {}}
    finally:
        torch.set_default_dtype(default)


def isolate_pieces(ref, test, inputs, dtype, repeat):
    """{piece: median seconds} of what isolate does, each timed alone, alternating."""
    # As isolate makes them: the truth's runs on the values of the dtype's runs.
    calls = isolation._record_calls(ref, inputs, None, "cpu", "keep", 0, dtype)
    traces = {}

    def role(name, model, role_dtype):
        values_of = dtype if role_dtype == torch.float64 else None

        def run():
            traces[name] = isolation._isolated_trace(model, calls, role_dtype, "cpu", "keep",
                                                     values_of)
        return run

    def truth_unwatched():
        watched = _precision.float64_truth
        _precision.float64_truth = _float64_unwatched
        try:
            isolation._isolated_trace(ref, calls, torch.float64, "cpu", "keep", dtype)
        finally:
            _precision.float64_truth = watched

    # `judge` judges the traces the three role pieces left: they run before it, in this
    # order, in the warm-up round as in every round (time_alternating keeps dict order).
    variants = {
        "record": lambda: isolation._record_calls(ref, inputs, None, "cpu", "keep", 0, dtype),
        "truth": role("truth", ref, torch.float64),
        "truth_unwatched": truth_unwatched,
        "ref": role("ref", ref, dtype),
        "test": role("test", test, dtype),
        "judge": lambda: _judge(traces["test"], traces["ref"], traces["truth"],
                                module_ranking=True),
    }
    return time_alternating(variants, repeat)


if __name__ == "__main__":
    main()
