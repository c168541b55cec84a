"""demo.py: judge one implementation of a model against another whose tensors are named and
laid out differently, and find the layer a planted bug is in.

    python examples/two_implementations/demo.py [OUT_DIR]

The reference is Hugging Face's Llama (``fused_llama.reference_llama``: a small config, built
here, nothing downloaded); the test is ``FusedLlama``, a re-implementation with fused QKV
and gate/up projections, carrying HF's weights, with a bug planted in layer 1: the k third
of its fused QKV projection's output is 3% too large. Three runs are traced with
``numalign.capture.trace_model`` (every module's inputs, outputs and gradients):

    test   FusedLlama, buggy, in bfloat16
    ref    HF's Llama in bfloat16
    truth  HF's Llama in float64

and judged through map.json, which pairs HF's names with FusedLlama's (the fused outputs
split into HF's q, k, v and gate, up pieces, each judged under HF's name). The example
promises that the first tensor to fail, going forward, is layer 1's k projection's output,
with its inputs aligned (so the blame lies with k_proj, i.e. the k piece of FusedLlama's
fused qkv), and that nothing else fails forward. It prints the failing tensors and the
first divergence, writes the HTML report to OUT_DIR/report.html when OUT_DIR is given, and
exits 0 when the promise holds, 1 when it does not."""
from __future__ import annotations

import re
import sys
from pathlib import Path

import torch

import numalign
from numalign.capture import trace_model

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import fused_llama  # noqa: E402

MAP_PATH = HERE / "map.json"
BUG_LAYER, BUG_PART = 1, "k"
CULPRIT = f"model.layers.{BUG_LAYER}.self_attn.{BUG_PART}_proj"


def is_backward(name: str) -> bool:
    """Whether trace_model recorded ``name`` in the backward pass (a gradient)."""
    return re.search(r"(^|\.)grad(_out)?(\.|$)", name) is not None


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    out_dir = Path(argv[0]) if argv else None

    hf = fused_llama.reference_llama()
    fused = fused_llama.from_hf(hf)
    fused_llama.plant_bug(fused, BUG_LAYER, BUG_PART)
    x = fused_llama.example_inputs()
    test = trace_model(fused, x, torch.bfloat16)
    ref = trace_model(hf, x, torch.bfloat16)
    truth = trace_model(hf, x, torch.float64, truth_of=torch.bfloat16)
    print(f"test:  FusedLlama, bug planted in layer {BUG_LAYER}'s {BUG_PART}, bfloat16 "
          f"({len(test)} tensors)")
    print(f"ref:   HF LlamaForCausalLM, bfloat16 ({len(ref)} tensors)")
    print("truth: HF LlamaForCausalLM, float64")

    report = numalign.judge(test, ref, truth, map=str(MAP_PATH))
    s = report.summary
    print(f"\njudged through {MAP_PATH.name}: {s['tensors']} tensors, {s['passed']} pass, "
          f"{s['failed']} fail, {s['errors']} could not be judged ({s['settings']})")
    for why in report.could_not_judge:
        print(f"could not judge: {why}")

    failing = [t for t in report.tensors if t["verdict"] != "pass"]
    print("\nfailing tensors (HF's names; test: where FusedLlama's value was read):")
    for t in failing:
        ratio = "-" if t["ratio"] is None else f"{t['ratio']:.3g}"
        print(f"  {t['verdict'].upper():5} {'backward' if is_backward(t['name']) else 'forward '} "
              f"{t['name']}  ratio {ratio} (limit {t['limit']})")
        print(f"        test: {t.get('test_source') or t['name']}")
        print(f"        {t['reason']}")

    divergence = report.first_divergence or {}
    print("\nfirst divergence:")
    for direction in ("forward", "backward"):
        point = divergence.get(direction)
        if point is None:
            print(f"  {direction}: none")
            continue
        inputs = {True: "its inputs pass: this module is the culprit",
                  False: f"inherited from failing inputs {point['failing_inputs']}",
                  None: "its inputs were not recorded"}[point["inputs_aligned"]]
        print(f"  {direction}: {point['tensor']} (module {point['module']}): {inputs}")
    if divergence.get("forward") and divergence.get("backward"):
        print("  (the backward pass runs on the forward's saved tensors: with a forward culprit,\n"
              "  a backward divergence downstream of it is its consequence; fix forward first)")

    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "report.html").write_text(report.to_html(), encoding="utf-8")
        print(f"\nHTML report: {out_dir / 'report.html'}")

    forward = divergence.get("forward") or {}
    forward_failing = [t["name"] for t in failing if not is_backward(t["name"])]
    promised = (not report.aligned and not report.could_not_judge
                and forward_failing == [f"{CULPRIT}.out"]
                and forward.get("tensor") == f"{CULPRIT}.out"
                and forward.get("module") == CULPRIT and forward.get("inputs_aligned") is True)
    print(f"\n{'as promised' if promised else 'NOT as promised'}: the first forward failure "
          f"should be {CULPRIT}.out alone, its inputs aligned")

    drilled = drill_down(fused, hf, x)
    return 0 if promised and drilled else 1


# The culprit's counterpart in FusedLlama: the fused projection whose k third HF's k_proj is.
PORT_MODULE = f"blocks.{BUG_LAYER}.attention.qkv"
HF_PROJECTIONS = [f"model.layers.{BUG_LAYER}.self_attn.{p}_proj" for p in "qkv"]


def drill_down(fused, hf, x) -> bool:
    """Which op inside the port's fused projection is wrong: trace_ops records every op of
    the selected modules, and an op-level map pairs the port's ops with HF's. The port's
    projection runs a matmul and then, before returning, builds a vector and multiplies by
    it; HF's q, k and v projections run the matmul alone. So the port's matmul is paired with
    HF's three matmuls (its thirds), and the port's last op, whose result the module
    returns, with HF's three outputs. True when the matmul passes and the last op's k third
    is the first to fail."""
    from numalign.capture import trace_ops

    test = trace_ops(fused, x, torch.bfloat16, modules=[PORT_MODULE])
    ref = trace_ops(hf, x, torch.bfloat16, modules=HF_PROJECTIONS)
    truth = trace_ops(hf, x, torch.float64, modules=HF_PROJECTIONS, truth_of=torch.bfloat16)
    port_ops = [n for n in test.metadata["order"] if n.startswith(PORT_MODULE + "/aten.")]
    print(f"\ndrilling into {PORT_MODULE} with trace_ops: the port runs {', '.join(port_ops)}; "
          f"HF's {BUG_PART}_proj runs {HF_PROJECTIONS[1]}/aten.mm#0 alone")
    last = port_ops[-1]
    op_map = {"map": [
        {"test": f"{PORT_MODULE}/aten.mm#0", "ref": [f"{m}/aten.mm#0" for m in HF_PROJECTIONS],
         "cat_dim": -1},
        {"test": last, "ref": [f"{m}.out" for m in HF_PROJECTIONS], "cat_dim": -1}],
        "ignore": [{"test": f"{PORT_MODULE}/aten.*",
                    "reason": "ops between the matmul and the last one build what the port "
                              "multiplies by: HF has no counterpart; their effect is judged "
                              "in the last op"}]}
    only = [f"{m}{suffix}" for m in HF_PROJECTIONS for suffix in ("/aten.*", ".out")]
    report = numalign.judge(test, ref, truth, map=op_map, only=only)
    for t in sorted(report.tensors, key=lambda t: t["name"]):
        ratio = "-" if t["ratio"] is None else f"{t['ratio']:.3g}"
        print(f"  {t['verdict'].upper():5} {t['name']}  ratio {ratio}  "
              f"(test: {t.get('test_source') or t['name']})")
    failing = [t for t in report.tensors if t["verdict"] != "pass"]
    named = [t.get("test_source", "") for t in failing]
    ok = (len(failing) == 1 and failing[0]["name"] == f"{CULPRIT}.out"
          and named[0].startswith(last + "[") and report.exit_code == 1)
    print(f"{'as promised' if ok else 'NOT as promised'}: the port's matmul passes, and its "
          f"op {last} is the one whose {BUG_PART} third fails")
    return ok

    return 0 if promised else 1


if __name__ == "__main__":
    sys.exit(main())
