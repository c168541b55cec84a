"""capture_bench.py: what recording a run costs (issue 23, item 3). On an HF Llama built from a
config (default: 8 layers, hidden 512, batch 2 x 256 tokens, bf16), each measured in turn,
the variants alternating, medians of --repeat runs:

    plain      the model in the dtype (cast once, outside the timing), forward + backward
               with a fixed upstream gradient: what the user's own step costs;
    copy       numalign's deep copy and cast of the model (_runs._module_copy) alone;
    run        capture.run_fwd_bwd: the copy, the run, the outputs and end gradients;
    hooks      what trace_model does with every module's hooks, but storing nothing: + the
               hooks and their bookkeeping (the "hooks" row of the pieces is hooks - run);
    memory     capture.trace_model held in memory: + the clones of what the hooks record;
    save_to    capture.trace_model(save_to=FILE): + writing the trace as it is produced
               (the "writes" row of the pieces is save_to - hooks), a new file each time;
    save_to_replacing  the same over the previous run's file: + the file system freeing the
               replaced file's blocks (in the rename).

    python bench/capture_bench.py [--layers 8 --hidden 512 --batch 2 --tokens 256 --repeat 3]
                                  [--threads N]
"""
from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import tempfile
import time

import torch
import transformers

from numalign import capture
from numalign._module_hooks import ModuleRecorder
from numalign._runs import _module_copy


class HooksOnly(ModuleRecorder):
    """trace_model's recorder with its hooks and bookkeeping, storing no tensor."""

    def _store(self, name, t):
        pass

    def finish(self, metadata):
        return None


def hooks_only(model, inputs, dtype):
    call, module, args, fingerprints = capture._prepare(model, inputs, dtype, "cpu")
    capture._record_run(HooksOnly(module, None, None), contextlib.nullcontext(), call, module,
                        args, fingerprints, dtype, "cpu", 0, "keep", None)


def llama(layers: int, hidden: int, vocab: int) -> transformers.LlamaForCausalLM:
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=hidden * 8 // 3,
        num_hidden_layers=layers, num_attention_heads=max(1, hidden // 64),
        num_key_value_heads=max(1, hidden // 64), max_position_embeddings=4096,
        use_cache=False, attn_implementation="eager")
    return transformers.LlamaForCausalLM(config).eval()


def model_arguments(description, *, layers, hidden, vocab, tokens):
    """The command line both capture benches share: the Llama's size, the batch, repeats and
    torch's threads (set here)."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--layers", type=int, default=layers)
    ap.add_argument("--hidden", type=int, default=hidden)
    ap.add_argument("--vocab", type=int, default=vocab)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=tokens)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    return args


def plain_step(model, args, dtype):
    """(inputs, step): the model's token inputs, and its forward + backward in ``dtype`` with
    a fixed upstream gradient, cast once here, outside any timing: the user's own step."""
    g = torch.Generator().manual_seed(1)
    inputs = {"input_ids": torch.randint(0, args.vocab, (args.batch, args.tokens), generator=g)}
    cast = _module_copy(model, dtype, "cpu")
    upstream = torch.randn(args.batch, args.tokens, args.vocab, generator=g).to(dtype)

    def step():
        cast.zero_grad(set_to_none=True)
        cast(**inputs).logits.backward(upstream)
    return inputs, step


def time_alternating(variants, repeat, after_each=None):
    """{name: median seconds} of each variant, run once to warm up (allocator, kernels, page
    cache), then `repeat` times in turn, so that all see the machine in the same state."""
    for f in variants.values():
        f()
    times = {v: [] for v in variants}
    for _ in range(repeat):
        for v, f in variants.items():
            start = time.perf_counter()
            f()
            times[v].append(time.perf_counter() - start)
            if after_each:
                after_each()
    return {v: statistics.median(t) for v, t in times.items()}


def main() -> None:
    args = model_arguments(__doc__.split("\n\n")[0], layers=8, hidden=512, vocab=8000,
                           tokens=256)
    dtype = getattr(torch, args.dtype)
    model = llama(args.layers, args.hidden, args.vocab)
    inputs, plain = plain_step(model, args, dtype)

    out_dir = tempfile.mkdtemp()
    path = os.path.join(out_dir, "trace.safetensors")
    written = iter(range(1 << 30))

    def save_to():  # a new file each time: replacing one costs freeing its blocks (see below)
        capture.trace_model(model, inputs, dtype, save_to=f"{path}.{next(written)}")
    variants = {
        "plain": plain,
        "copy": lambda: _module_copy(model, dtype, "cpu"),
        "run": lambda: capture.run_fwd_bwd(model, inputs, dtype),
        "hooks": lambda: hooks_only(model, inputs, dtype),
        "memory": lambda: capture.trace_model(model, inputs, dtype),
        "save_to": save_to,
        "save_to_replacing": lambda: capture.trace_model(model, inputs, dtype, save_to=path),
    }
    def remove_new_files():  # outside the timing
        for old in os.listdir(out_dir):
            if old != "trace.safetensors":
                os.remove(os.path.join(out_dir, old))

    median = time_alternating(variants, args.repeat, after_each=remove_new_files)
    size = os.path.getsize(path) / 1e6
    os.remove(path)
    os.rmdir(out_dir)
    base = median["plain"]
    params = sum(p.numel() for p in model.parameters()) / 1e6
    print(f"HF Llama, {args.layers} layers, hidden {args.hidden}, {params:.1f}M parameters, "
          f"batch {args.batch} x {args.tokens}, {args.dtype}, torch threads "
          f"{torch.get_num_threads()}; trace {size:.0f} MB; median of {args.repeat}")
    print("| variant | seconds | vs plain |")
    print("| --- | ---: | ---: |")
    for v in variants:
        print(f"| {v} | {median[v]:.3f} | {median[v] / base:.2f}x |")
    print()
    print("| piece of save_to | seconds | share of plain |")
    print("| --- | ---: | ---: |")
    pieces = {"copy and cast of the model": median["copy"],
              "run_fwd_bwd beyond plain and copy (fingerprints, upstream gradient)":
                  median["run"] - base - median["copy"],
              "hooks (hooks - run)": median["hooks"] - median["run"],
              "writes (save_to - hooks)": median["save_to"] - median["hooks"]}
    for what, sec in pieces.items():
        print(f"| {what} | {sec:.3f} | {sec / base:.2f}x |")


if __name__ == "__main__":
    main()
