"""capture.py: run a function or module forward and backward in one precision and record
outputs, input grads and parameter grads as a Trace, so truth / ref / test runs line up."""
from __future__ import annotations

import contextlib
import platform

import torch

from . import _precision
from ._module_hooks import ModuleRecorder, RecordingBudgetExceeded  # noqa: F401 (raised here)
from ._op_hooks import OpRecorder
from ._runs import (_as_args, _cast, _forward_backward, _module_copy, check_autocast,
                    check_truth_of, dtype_name, is_compiled, recipe_name, tf32_off,
                    upstream_recipe, watch_randomness)
from ._tensors import fingerprint, flatten
from .isolation import isolate  # noqa: F401  (users find it beside trace_model)
from .trace import Trace


def _source_of(module):
    """The module a ``torch.compile``'d one wraps (an OptimizedModule's ``_orig_mod``), whose
    names (no ``_orig_mod.`` prefix) its tensors are recorded under; the module itself
    otherwise."""
    return getattr(module, "_orig_mod", module) if is_compiled(module) else module


def _prepare(fn, inputs, dtype, device, float64_truth="keep", truth_of=None):
    """(callable, module copy or None, cast inputs, fingerprints of inputs and parameters); a
    truth's (``truth_of``) inputs and parameters are its runs' values, widened. For a
    compiled model the module returned is the copy's source (see _source_of): the callable
    runs the compiled code."""
    inputs_list = _as_args(inputs)
    fingerprints = {f"input.{k}": fingerprint(v) for k, v in flatten(inputs_list).items()
                    if isinstance(v, torch.Tensor)}
    module = None
    if isinstance(fn, torch.nn.Module):
        fingerprints.update({f"param.{name}": fingerprint(p)
                             for name, p in _source_of(fn).named_parameters()})
        fn = _module_copy(fn, dtype, device, float64_truth, truth_of)
        module = _source_of(fn)
    return fn, module, _cast(inputs_list, dtype, device, truth_of), fingerprints


def _truth_watch(module, dtype, mode):
    """The float64 truth's watch (see _precision.py) for a float64 run; nothing otherwise."""
    _precision.check_mode(mode)
    if dtype != torch.float64:
        return contextlib.nullcontext({})
    return _precision.float64_truth(module, mode)


def _end_grads(args, module):
    """{name: grad} of the inputs and parameters after backward."""
    grads = {}
    for k, v in flatten(args).items():
        if isinstance(v, torch.Tensor) and v.grad is not None:
            grads[f"grad.input.{k}"] = v.grad.detach()
    if module is not None:
        for name, p in module.named_parameters():
            if p.grad is not None:
                grads[f"grad.param.{name}"] = p.grad.detach()
    return grads


def _metadata(dtype, device, seed, fingerprints, order, tags, random, inputs=None,
              not_recorded=None, precision=None, truth_of=None, caches_seeded=False,
              autocast=None):
    meta = {
        "dtype_recipe": recipe_name(dtype, autocast),
        "device": str(device),
        "versions": {"torch": torch.__version__, "python": platform.python_version()},
        "tf32": {"matmul": torch.backends.cuda.matmul.allow_tf32,
                 "cudnn": torch.backends.cudnn.allow_tf32},
        "seed": seed,
        "upstream_gradient": upstream_recipe(caches_seeded),
        "order": order,
        "tags": tags,
        "fingerprints": fingerprints,
        "random": random,
    }
    if truth_of is not None and dtype == torch.float64:  # a truth on its runs' values
        meta["truth_of"] = dtype_name(truth_of)
    if inputs:
        meta["inputs"] = inputs
    if not_recorded:
        meta["not_recorded"] = not_recorded
    if precision:  # a float64 run: how it kept float64, and where it still computed in less
        meta["float64_truth"] = precision["mode"]
        meta["below_float64"] = precision["below_float64"]
        meta["raised_to_float64"] = precision["raised"]
    return meta


def _kind_of(name):
    return ("output" if name.startswith("out") else
            "input-grad" if name.startswith("grad.input") else "param-grad")


def run_fwd_bwd(fn, inputs, dtype, *, seed: int = 0, device="cpu",
                float64_truth: str = "keep", truth_of=None,
                caches_seed_backward: bool = False, autocast=None) -> Trace:
    """Runs ``fn(*inputs)`` (or ``fn(**inputs)`` for a dict) in ``dtype`` on ``device``, then
    backward with fixed upstream gradients; returns a Trace of ``out.*``, ``grad.input.*`` and
    ``grad.param.*`` in execution order. ``fn`` (a module is deep-copied) is left untouched;
    the copy's parameters and persistent floating buffers (BatchNorm's statistics) are cast to
    ``dtype`` as ``Module.to`` casts them, non-persistent ones (rotary frequencies) kept.
    A float64 run is a truth and stays float64: with ``float64_truth="keep"`` casts down
    inside it (``.float()``, ``dtype=torch.float32``) compute in float64 and floating buffers
    are float64; ``"watch"`` runs the code as written. Either way the trace records where it
    still computed in less than float64 (``below_float64``), and the judge warns.
    ``truth_of`` (the dtype of the runs this truth judges, e.g. ``torch.bfloat16``): the truth
    computes on what those runs hold, its inputs, parameters and upstream gradient rounded to
    that dtype and widened exactly, so that the rounding they share is no part of the
    allowance; the judge warns when a truth for lower-precision runs was made without it. A
    run in ``truth_of`` itself may be given it too (it changes nothing there).
    Every floating output seeds backward except the tensors of a Hugging Face cache the
    model returns (state for the next tokens, which a port without a cache lacks and no loss
    reads): ``caches_seed_backward=True`` seeds them too. Either way they are recorded.
    ``autocast`` (e.g. ``torch.bfloat16``): the forward pass runs under ``torch.autocast`` in
    that dtype, parameters and inputs held in ``dtype`` (``torch.float32``), recorded as the
    recipe "float32+autocast(bfloat16)"; its truth is a float64 run with ``truth_of=dtype``."""
    truth_of = check_truth_of(dtype, truth_of)  # None unless a float64 truth
    check_autocast(dtype, autocast)
    call, module, args, fingerprints = _prepare(fn, inputs, dtype, device, float64_truth,
                                                truth_of)
    with tf32_off():
        with watch_randomness(module) as random, _truth_watch(module, dtype, float64_truth) as precision:
            outputs, caches_seeded = _forward_backward(call, args, seed, truth_of,
                                                       caches_seed_backward, autocast, device)
        tensors = {n: o.detach() for n, o in outputs.items()}
        tensors.update(_end_grads(args, module))
        # Everything here is computed from the run's own inputs (the same in every run, as
        # their fingerprints check): a failing tensor makes the function itself the culprit.
        metadata = _metadata(dtype, device, seed, fingerprints, list(tensors),
                             {n: {"kind": _kind_of(n)} for n in tensors}, random,
                             {n: [] for n in tensors}, precision=precision, truth_of=truth_of,
                             caches_seeded=caches_seeded, autocast=autocast)
    return Trace(tensors, metadata=metadata)


def trace_model(model, inputs, dtype, *, modules=None, seed: int = 0, save_to=None,
                device="cpu", float64_truth: str = "keep", memory_budget=None,
                truth_of=None, caches_seed_backward: bool = False, autocast=None) -> Trace:
    """Runs ``model`` forward and backward like ``run_fwd_bwd`` and records every selected
    submodule on the way: its inputs (``PATH.in``), outputs (``PATH.out``), the gradients it
    passes upstream (``PATH.grad``) and those it received (``PATH.grad_out``); a module
    called again gets a call index (``layers.0.attn#1.out``). ``modules``: globs on module
    paths (default all). The trace keeps execution order and, per tensor, its module, kind
    and call, and what it was computed from, so a judgement can name the first module to
    go wrong. With ``save_to``, tensors stream to that file as they are produced (copied
    into 8 MiB of buffers that a background thread writes: recording holds no tensor the
    model has let go) and the returned Trace maps it; without it, the
    trace is held in memory up to ``memory_budget`` bytes (default half of the memory
    available when the call starts), past which it stops with RecordingBudgetExceeded
    rather than exhaust the machine. A float64 run stays float64 as in ``run_fwd_bwd``
    (``float64_truth``), and computes on its runs' values with ``truth_of``. A returned
    cache seeds no gradient unless ``caches_seed_backward`` (as in ``run_fwd_bwd``).
    ``modules=[]`` records the model's own inputs, outputs and gradients only; a
    ``torch.compile``'d model is recorded so (a hook inside it would change what is
    compiled), under its source's names (no ``_orig_mod.``): judge it against a run of the
    plain model recorded with ``modules=[]``. ``autocast`` as in ``run_fwd_bwd``."""
    truth_of = check_truth_of(dtype, truth_of)  # None unless a float64 truth
    check_autocast(dtype, autocast)
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"trace_model needs a torch.nn.Module, got {type(model).__name__}")
    if is_compiled(model):
        if modules:
            raise ValueError(
                "trace_model records a torch.compile'd model at its outputs and parameters' "
                "gradients only: hooks inside it would change what is compiled (graph breaks, "
                "recompiles). Pass modules=[] for it (and for the run it is judged against), "
                "and trace the uncompiled model (model._orig_mod) to look inside")
        modules = []
    call, module, args, fingerprints = _prepare(model, inputs, dtype, device, float64_truth,
                                                truth_of)
    recorder = ModuleRecorder(module, modules, save_to, memory_budget)
    return _record_run(recorder, contextlib.nullcontext(), call, module, args, fingerprints,
                       dtype, device, seed, float64_truth, truth_of, caches_seed_backward,
                       autocast)


def _record_run(recorder, ops, call, module, args, fingerprints, dtype, device, seed,
                float64_truth, truth_of, caches_seed_backward=False, autocast=None) -> Trace:
    """Runs forward and backward with ``recorder``'s hooks (and ``ops``, entered inside the
    truth's watch, so that it sees each op as the model called it) and returns the trace."""
    try:
        with tf32_off(), recorder.hooked():
            with watch_randomness(module) as random, \
                    _truth_watch(module, dtype, float64_truth) as precision, ops:
                outputs, caches_seeded = _forward_backward(call, args, seed, truth_of,
                                                           caches_seed_backward, autocast, device)
            # The model's own results and input gradients: computed by its code (outside
            # every submodule) from the run's inputs, the same in every run.
            for n, o in outputs.items():
                recorder.record(n, torch.as_tensor(o), module="", kind="output", inputs=[])
            grads = _end_grads(args, module)
            for n, g in grads.items():
                if not n.startswith("grad.param."):
                    recorder.record(n, g, module="", kind="input-grad", inputs=[])
            recorder.record_param_grads({n: g for n, g in grads.items() if n.startswith("grad.param.")})
            metadata = _metadata(dtype, device, seed, fingerprints, recorder.order, recorder.tags,
                                 random, recorder.inputs, recorder.skipped, precision, truth_of,
                                 caches_seeded, autocast)
    except BaseException:
        recorder.abort()
        raise
    return recorder.finish(metadata)


def trace_ops(model, inputs, dtype, *, modules, seed: int = 0, device="cpu",
              float64_truth: str = "keep", save_to=None, memory_budget=None,
              truth_of=None, caches_seed_backward: bool = False, autocast=None) -> Trace:
    """Records what ``trace_model(..., modules=modules)`` records and, inside the selected
    modules, every ATen op's floating outputs, forward (``MODULE/aten.OP#k``, k its place
    in that module call's op sequence) and backward (``MODULE/grad/aten.OP#k``), each
    tagged with its module, kind ("op" or "op-grad"), call and op ("aten.mm"), with the
    recorded tensors it was computed from. Judging such traces names the first op that
    fails while its inputs pass. Runs of the same code (the float64 truth included) run the
    same ops and pair op by op; where two implementations' op sequences differ, the judge
    says where they stop matching and does not judge the ops from there on as pairs.
    ``modules`` (globs on module paths) is required: op-level traces are for the modules a
    model-level judgement pointed at. Views, casts and copies are not recorded (see
    _op_hooks.py for what is, and the limits of ``inputs``). Other arguments as
    ``trace_model``."""
    truth_of = check_truth_of(dtype, truth_of)  # None unless a float64 truth
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"trace_ops needs a torch.nn.Module, got {type(model).__name__}")
    if is_compiled(model):
        raise ValueError("trace_ops records ops as the model calls them: a torch.compile'd "
                         "model runs compiled graphs instead; trace the uncompiled model "
                         "(model._orig_mod)")
    if modules is None or (not isinstance(modules, str) and not list(modules)):
        raise ValueError("trace_ops needs modules=[globs]: the modules to record op by op")
    call, module, args, fingerprints = _prepare(model, inputs, dtype, device, float64_truth,
                                                truth_of)
    recorder = OpRecorder(module, modules, save_to, memory_budget)
    if not recorder.selected:
        recorder.abort()
        raise ValueError(f"trace_ops: no submodule of the model matches modules={modules!r}")
    check_autocast(dtype, autocast)
    return _record_run(recorder, recorder.ops(), call, module, args, fingerprints, dtype,
                       device, seed, float64_truth, truth_of, caches_seed_backward, autocast)
