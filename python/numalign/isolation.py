"""isolation.py: each module judged on its own. A whole-model trace shows where the error
first appears; isolation answers a different question, how wrong each module is by itself:
every module of the test and of the reference runs on the float64 truth's inputs to that
module (cast to the dtype) and, backward, on the truth's gradient into it, so no module
inherits the error of the modules before it."""
from __future__ import annotations

import contextlib

import torch

from ._module_hooks import _call_values, _tensors_of, watch_gradients
from . import _precision
from ._runs import (_as_args, _cast, _forward_backward, _held_as, _module_copy,
                    autocast_context, check_autocast, dtype_name, is_compiled, recipe_name,
                    selected_modules, tf32_off, watch_randomness)
from ._tensors import is_hf_cache
from .api import _judge
from .report import Report
from .trace import Trace


class _Calls:
    """Every call of the selected modules in the truth run: its inputs (float64) and the
    gradients its outputs received, by output name."""

    def __init__(self, model, globs):
        self.modules = selected_modules(model, globs)
        self.calls = []      # (path, call index, args, kwargs), in forward order
        self.grad_out = {}   # (path, call index) -> {output suffix: gradient it received}
        self._count, self._stack = {}, []

    def _pre(self, path):
        def hook(module, args, kwargs):
            k = self._count.get(path, 0)
            self._count[path] = k + 1
            # Copies: the model may later change its inputs in place. A cache is state the
            # model fills as it goes; run alone, a module needs none (isolate refuses a past).
            a, kw = _cast((list(args), dict(kwargs)), torch.float64, "cpu")
            a = [x.clone() if isinstance(x, torch.Tensor) else None if is_hf_cache(x) else x
                 for x in a]
            kw = {n: x.clone() if isinstance(x, torch.Tensor) else None if is_hf_cache(x) else x
                  for n, x in kw.items()}
            self.calls.append((path, k, a, kw))
            self._stack.append((path, k))
        return hook

    def _post(self, path):
        def hook(module, args, kwargs, output):
            key = self._stack.pop()
            received = self.grad_out.setdefault(key, {})

            def keep(suffix, grad):
                received[suffix] = grad.detach().clone()
            return watch_gradients(output, _tensors_of(output, {}), keep)
        return hook

    def hooks(self):
        handles = []
        for path, m in self.modules:
            handles.append(m.register_forward_pre_hook(self._pre(path), with_kwargs=True))
            handles.append(m.register_forward_hook(self._post(path), with_kwargs=True))
        return handles


def _run_isolated(model, calls, dtype, device, mode, values_of=None, autocast=None):
    """Runs each recorded call on a copy of ``model`` in ``dtype``: {name: tensor}, tags, for
    float64 the truth's precision record (see _precision.py), and the randomness it used. The
    truth's (``values_of``: its runs' dtype) computes on its runs' values, widened."""
    copied = _module_copy(model, dtype, device, mode, values_of)
    watch = (_precision.float64_truth(copied, mode) if dtype == torch.float64
             else contextlib.nullcontext())
    called = sorted({path for path, *_ in calls.calls})
    with watch_randomness(copied, within=called) as used, watch as precision:
        tensors, tags = _run_calls(copied, calls, dtype, device, values_of, autocast)
    return tensors, tags, precision, used


def _run_calls(copied, calls, dtype, device, values_of=None, autocast=None):
    by_path = dict(copied.named_modules())
    tensors, tags = {}, {}

    def keep(name, t, path, kind):
        tensors[name] = t.detach().clone()
        tags[name] = {"module": path, "kind": kind}

    for path, k, args, kwargs in calls.calls:
        module = by_path[path]
        module.zero_grad(set_to_none=True)
        a, kw = _cast((args, kwargs), dtype, device, values_of)
        base = path if k == 0 else f"{path}#{k}"
        try:
            _run_call(module, a, kw, calls.grad_out.get((path, k), {}), base, path, keep,
                      values_of, autocast, device)
        except Exception as e:
            raise RuntimeError(
                f"isolate could not run {base!r} ({type(module).__name__}) on its own in "
                f"{dtype_name(dtype)}: {e} (leave it out with modules=[...] "
                "globs that do not match it)") from e
    return tensors, tags


def _run_call(module, a, kw, grads, base, path, keep, values_of=None, autocast=None,
              device="cpu"):
    """One call on its own: forward, then backward from the gradients its outputs received
    in the truth run ({output suffix: gradient}; a truth's as its runs hold them), keeping what
    it computed."""
    with autocast_context(autocast, device):
        out = module(*a, **kw)
    outs = _tensors_of(out, {})
    for suffix, t in outs.items():
        keep(f"{base}.out{suffix}", t, path, "output")
    pairs = [(t, grads[s]) for s, t in outs.items() if s in grads and t.requires_grad]
    if not pairs:
        return
    torch.autograd.backward([t for t, _ in pairs],
                            [_held_as(g, t.dtype, values_of) for t, g in pairs])
    # Named as trace_model names them: positional inputs by index, keyword ones by name.
    for suffix, x in _tensors_of(_call_values(a, kw), {}).items():
        if x.grad is not None:
            keep(f"{base}.grad{suffix}", x.grad, path, "grad")
    for pname, p in module.named_parameters():
        if p.grad is not None:
            keep(f"{base}.grad.param.{pname}", p.grad, path, "param-grad")


def _record_calls(model, inputs, globs, device, mode, seed, values_of=None):
    """One float64 forward and backward of ``model`` on the inputs, parameters and upstream
    gradient of its ``values_of`` runs, widened: every call of the selected modules, with the
    truth's inputs to it and the gradients its outputs received (_Calls)."""
    copied = _module_copy(model, torch.float64, device, mode, values_of)
    args = _cast(_as_args(inputs), torch.float64, device, values_of)
    calls = _Calls(copied, globs)
    handles = calls.hooks()
    try:
        with tf32_off(), _precision.float64_truth(copied, mode):
            _forward_backward(copied, args, seed, values_of)  # caches seed no gradient
    finally:
        for h in handles:
            h.remove()
    return calls


def _isolated_trace(model, calls, dtype, device, mode, values_of=None, autocast=None):
    """The trace of one role: every recorded call of ``model`` rerun on its own in ``dtype``
    (the truth's on the values of its ``values_of`` runs)."""
    with tf32_off():
        tensors, tags, precision, used = _run_isolated(model, calls, dtype, device, mode,
                                                       values_of, autocast)
    # A run that drew random numbers computes on draws no other run shares: the judge then
    # cannot judge (fail closed), as for trace_model's runs.
    metadata = {"dtype_recipe": recipe_name(dtype, autocast), "order": list(tensors),
                "tags": tags, "random": used}
    if precision:
        metadata["below_float64"] = precision["below_float64"]
    if values_of is not None:
        metadata["truth_of"] = dtype_name(values_of)
    return Trace(tensors, metadata=metadata)


def _check_same_modules(model_test, calls, globs):
    """Each module is rerun on the inputs ref's module at that path was handed: a test model
    without a module at one of those paths (another implementation, its modules named or
    fused otherwise) cannot be isolated there. Refused before any test run, naming them."""
    test_paths = {p for p, _ in model_test.named_modules()}
    called = sorted({path for path, *_ in calls.calls})
    missing = [p for p in called if p not in test_paths]
    if not missing:
        return
    shared = [p for p in called if p in test_paths]
    first = ", ".join(repr(p) for p in missing[:3]) + (f" and {len(missing) - 3} more"
                                                       if len(missing) > 3 else "")
    hint = (f"select modules both have with modules=[globs] ({len(shared)} of the {len(called)} "
            f"called are shared, e.g. {shared[0]!r})" if shared else
            "the two models share no module path")
    selected = "" if globs is None else f" selected by modules={globs!r}"
    raise ValueError(
        f"isolate reruns each module of model_ref{selected} on the inputs it was handed, in "
        f"model_test's module at the same path; model_test has no module {first}: {hint}, or "
        "judge whole-model traces with map= and read the report's first divergence")


def isolate(model_test, model_ref, inputs, dtype, *, modules=None, seed: int = 0, device="cpu",
            float64_truth: str = "keep", autocast=None, **judge_options) -> Report:
    """Judges every selected module (globs on module paths; default all) of ``model_test``
    against the same module of ``model_ref``, each run on the float64 truth's inputs to
    that module, forward and backward. The Report's ``ranking`` lists modules by their own
    worst ratio / limit, the module most wrong by itself first; ``str(report)`` starts
    with it. The truth's runs stay float64 as in ``capture.run_fwd_bwd`` (``float64_truth``).
    Modules that draw random numbers as they stand (dropout in training mode) are not
    judged (could not judge) unless ``shared_randomness=REASON`` says why the draws match.
    ``autocast``: the runs' forward passes under ``torch.autocast`` in that dtype, their
    parameters and inputs held in ``dtype`` (as ``trace_model``'s). ``judge_options`` are
    those of ``judge()``."""
    _precision.check_mode(float64_truth)
    check_autocast(dtype, autocast)
    for m in (model_test, model_ref):
        if not isinstance(m, torch.nn.Module):
            raise TypeError(f"isolate needs torch.nn.Module models, got {type(m).__name__}")
        if is_compiled(m):
            raise ValueError("isolate reruns each module on its own, which a torch.compile'd "
                             "model does not do (it runs compiled graphs): pass the uncompiled "
                             "model (model._orig_mod)")
    past = [n for n, v in (inputs.items() if isinstance(inputs, dict) else enumerate(_as_args(inputs)))
            if is_hf_cache(v)]
    if past:
        raise ValueError(f"isolate runs each module on one forward pass over the inputs; input "
                         f"{past[0]!r} is a cache of earlier tokens, which a module run alone "
                         "cannot use: pass the whole sequence and no cache")
    # No fingerprints here: the three runs are made from one set of inputs, in this call.
    # The truth sees what the runs see: the inputs, parameters and gradients they hold.
    calls = _record_calls(model_ref, inputs, modules, device, float64_truth, seed, dtype)
    _check_same_modules(model_test, calls, modules)
    runs = {role: _isolated_trace(model, calls, role_dtype, device, float64_truth, values_of, cast)
            for role, model, role_dtype, values_of, cast in (
                ("truth", model_ref, torch.float64, dtype, None),
                ("ref", model_ref, dtype, None, autocast),
                ("test", model_test, dtype, None, autocast))}
    # No first divergence here, where no module sees another's output: the core ranks the
    # modules by their own worst tensor instead.
    return _judge(runs["test"], runs["ref"], runs["truth"], module_ranking=True, **judge_options)
