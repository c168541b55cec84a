"""ref_vs_truth.py: how far a reference run is from its float64 truth, tensor by tensor, on
legitimate runs and on runs that are not renditions of the truth (different dropout masks,
different inputs). The judge's "ref far off its truth" bound (docs/architecture.md) is chosen
from these distributions.

    .venv/bin/python bench/ref_vs_truth.py

Prints, per dtype and set, the quantiles of r = ||ref - truth|| / ||truth|| / u, the
relative L2 error in units of the ref dtype's unit roundoff u (2^-8 bf16, 2^-11 fp16,
2^-24 fp32), over the tensors whose ref is farther from the truth than same()'s default tol
as their RMSE (the others raise no question), and the tensors with the largest r. The
judge's check (judge.cpp, check_reference_renders_truth) uses this very criterion."""
import copy
import sys
from pathlib import Path

import torch

from numalign.capture import trace_model

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples" / "hf"))
sys.path.insert(0, str(ROOT / "examples" / "transformer"))
import hf_models  # noqa: E402
import model as transformer  # noqa: E402

UNIT_ROUNDOFF = {torch.bfloat16: 2.0 ** -8, torch.float16: 2.0 ** -11, torch.float32: 2.0 ** -24}
DTYPES = (torch.bfloat16, torch.float16, torch.float32)
RUN_BOUND = 32  # r above which a tensor's ref is counted as far off, per run
# A float32 tensor may hold a result computed in bf16 (autocast, master-weight gradients)
# or TF32: its roundoff is counted as at least bf16's, so such runs are not mistaken for
# non-renditions. The bound is then a relative error of at least 32 x 2^-8 = 12.5%.
COARSEST = 2.0 ** -8
TOL = 1e-4  # same()'s default tol: ref within allclose(atol=tol, rtol=tol) of truth is no question


def r_values(ref, truth, dtype, label):
    """[(r, label:name)] of the floating tensors both hold, truth not all zero."""
    out = []
    for name in truth:
        if name not in ref:
            continue
        t, f = truth[name], ref[name]
        if not (t.is_floating_point() and f.is_floating_point()) or t.shape != f.shape:
            continue
        norm = t.double().norm().item()
        rmse = (f.double() - t.double()).pow(2).mean().sqrt().item()
        if norm == 0 or not rmse > TOL:
            continue  # within same()'s tol of the truth: no question (as the judge decides)
        rel = (f.double() - t.double()).norm().item() / norm
        out.append((rel / max(UNIT_ROUNDOFF[dtype], COARSEST), f"{label}:{name}"))
    return out


def model_runs(model, inputs, dtype, label, truth_model=None, truth_inputs=None):
    truth = trace_model(truth_model or model, truth_inputs or inputs, torch.float64)
    ref = trace_model(model, inputs, dtype)
    return r_values(ref, truth, dtype, label)


def matmul_runs(dtype):
    out = []
    for k in (256, 4096, 16384):
        g = torch.Generator().manual_seed(k)
        a, b = torch.randn(64, k, generator=g), torch.randn(k, 64, generator=g)
        truth = {"mm": a.double() @ b.double()}
        ref = {"mm": a.to(dtype) @ b.to(dtype)}
        out += r_values(ref, truth, dtype, f"matmul K={k}")
    return out


def allreduce_runs(dtype):
    """Four ranks' parts summed, rounded, a residual added and rounded (the unfused
    reference), with random signs: the residual can cancel the sum."""
    out = []
    for magnitude in (1.0, 16.0, 256.0):
        g = torch.Generator().manual_seed(int(magnitude))
        parts = [torch.randn(64, 2048, generator=g) * magnitude for _ in range(4)]
        residual = -sum(parts) + torch.randn(64, 2048, generator=g)  # heavy cancellation
        truth = {"y": sum(p.double() for p in parts) + residual.double()}
        s = sum(p.to(dtype).float() for p in parts).to(dtype)
        ref = {"y": (s.float() + residual.to(dtype).float()).to(dtype)}
        out += r_values(ref, truth, dtype, f"allreduce x{magnitude:g}")
    return out


def legitimate(dtype):
    out = []
    reference, _ = transformer.make_models()
    out += model_runs(reference, (transformer.make_input(),), dtype, "transformer")
    x = hf_models.inputs()
    out += model_runs(hf_models.llama(), x, dtype, "llama")
    out += model_runs(hf_models.bert(), x, dtype, "bert")
    loaded = hf_models.minilm()
    if loaded:
        model, tokenizer = loaded
        batch = dict(tokenizer(["numerical alignment of a port", "bf16 on a new chip"],
                               padding=True, return_tensors="pt"))
        out += model_runs(model, batch, dtype, "minilm")
    return out + matmul_runs(dtype) + allreduce_runs(dtype)


def not_renditions(dtype):
    """Runs whose reference is not the truth's computation in another precision."""
    out = []
    x = hf_models.inputs()
    bert_train = hf_models.bert().train()  # dropout 0.1: each run draws its own masks
    torch.manual_seed(1)
    truth = trace_model(bert_train, x, torch.float64)
    torch.manual_seed(2)
    out += r_values(trace_model(bert_train, x, dtype), truth, dtype, "bert dropout")
    seq = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Dropout(0.1)).train()
    v = torch.randn(8, 64, generator=torch.Generator().manual_seed(3))
    torch.manual_seed(1)
    truth = trace_model(seq, (v,), torch.float64)
    torch.manual_seed(2)
    out += r_values(trace_model(seq, (v,), dtype), truth, dtype, "linear+dropout")
    other = hf_models.inputs()
    other["input_ids"] = (other["input_ids"] + 1) % 64  # every token different
    out += model_runs(hf_models.llama(), other, dtype, "llama other inputs", truth_inputs=x)
    near = copy.deepcopy(x)
    near["input_ids"][0, 3] = (near["input_ids"][0, 3] + 1) % 64  # one token different
    out += model_runs(hf_models.llama(), near, dtype, "llama one token off", truth_inputs=x)
    return out


def quantiles(values):
    v = sorted(r for r, _ in values)
    if not v:
        return "n=    0  (every ref within tol of its truth)"
    pick = lambda q: v[min(len(v) - 1, int(q * (len(v) - 1)))]  # noqa: E731
    return (f"n={len(v):5d}  min {v[0]:10.3g}  p1 {pick(0.01):10.3g}  median {pick(0.5):10.3g}"
            f"  p99 {pick(0.99):10.3g}  max {v[-1]:10.3g}")


def by_run(values, bound):
    """{run label: (tensors over bound, tensors)}."""
    runs = {}
    for r, label in values:
        run = label.split(":")[0]
        over, n = runs.get(run, (0, 0))
        runs[run] = (over + (r > bound), n + 1)
    return runs


def main():
    for dtype in DTYPES:
        name = str(dtype).replace("torch.", "")
        good, bad = legitimate(dtype), not_renditions(dtype)
        print(f"== {name} (u = 2^{int(torch.log2(torch.tensor(UNIT_ROUNDOFF[dtype])))})")
        print(f"  legitimate       {quantiles(good)}")
        print(f"  not a rendition  {quantiles(bad)}")
        print("  largest legitimate:", ", ".join(f"{label} {r:.3g}" for r, label in sorted(good)[-3:]))
        print("  smallest not-a-rendition:", ", ".join(f"{label} {r:.3g}" for r, label in sorted(bad)[:3]))
        for title, values in (("legitimate", good), ("not a rendition", bad)):
            runs = by_run(values, RUN_BOUND)
            print(f"  {title}, tensors over r = {RUN_BOUND} per run:",
                  ", ".join(f"{run} {over}/{n}" for run, (over, n) in runs.items()))


if __name__ == "__main__":
    main()

