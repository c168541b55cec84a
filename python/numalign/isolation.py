"""isolation.py: each module judged on its own. A whole-model trace shows where the error
first appears; isolation answers a different question, how wrong each module is by itself:
every module of the test and of the reference runs on the float64 truth's inputs to that
module (cast to the dtype) and, backward, on the truth's gradient into it, so no module
inherits the error of the modules before it."""
from __future__ import annotations

import torch

from ._module_hooks import _tensors_of
from ._runs import _as_args, _cast, _forward_backward, _module_copy, selected_modules, tf32_off
from .api import _judge
from .report import Report
from .trace import Trace


class _Calls:
    """Every call of the selected modules in the truth run: its inputs (float64) and the
    gradients its outputs received."""

    def __init__(self, model, globs):
        self.modules = selected_modules(model, globs)
        self.calls = []      # (path, call index, args, kwargs), in forward order
        self.grad_out = {}   # (path, call index) -> gradients of its outputs
        self._count, self._pending = {}, {}

    def _pre(self, path):
        def hook(module, args, kwargs):
            k = self._count.get(path, 0)
            self._count[path] = k + 1
            # Copies: the model may later change its inputs in place.
            a, kw = _cast((list(args), dict(kwargs)), torch.float64, "cpu")
            a = [x.clone() if isinstance(x, torch.Tensor) else x for x in a]
            kw = {n: x.clone() if isinstance(x, torch.Tensor) else x for n, x in kw.items()}
            self.calls.append((path, k, a, kw))
            self._pending.setdefault(path, []).append(k)
        return hook

    def _backward(self, path):
        def hook(module, grad_input, grad_output):
            k = self._pending[path].pop()
            self.grad_out[(path, k)] = [None if g is None else g.detach().clone() for g in grad_output]
        return hook

    def hooks(self):
        handles = []
        for path, m in self.modules:
            handles.append(m.register_forward_pre_hook(self._pre(path), with_kwargs=True))
            handles.append(m.register_full_backward_hook(self._backward(path)))
        return handles


def _run_isolated(model, calls, dtype, device):
    """Runs each recorded call on a copy of ``model`` in ``dtype``: {name: tensor}, tags."""
    by_path = dict(_module_copy(model, dtype, device).named_modules())
    tensors, tags = {}, {}

    def keep(name, t, path, kind):
        tensors[name] = t.detach().clone()
        tags[name] = {"module": path, "kind": kind}

    for path, k, args, kwargs in calls.calls:
        module = by_path[path]
        module.zero_grad(set_to_none=True)
        a, kw = _cast((args, kwargs), dtype, device)
        base = path if k == 0 else f"{path}#{k}"
        out = module(*a, **kw)
        outs = _tensors_of(out)
        for suffix, t in outs.items():
            keep(f"{base}.out{suffix}", t, path, "output")
        grads = calls.grad_out.get((path, k))
        pairs = [(t, g) for t, g in zip(outs.values(), grads or []) if g is not None and t.requires_grad]
        if pairs:
            torch.autograd.backward([t for t, _ in pairs], [g.to(t.dtype) for t, g in pairs])
            for suffix, x in _tensors_of(a).items():
                if x.grad is not None:
                    keep(f"{base}.grad{suffix}", x.grad, path, "grad")
            for pname, p in module.named_parameters():
                if p.grad is not None:
                    keep(f"{base}.grad.param.{pname}", p.grad, path, "param-grad")
    return tensors, tags


def isolate(model_test, model_ref, inputs, dtype, *, modules=None, seed: int = 0, device="cpu",
            **judge_options) -> Report:
    """Judges every selected module (globs on module paths; default all) of ``model_test``
    against the same module of ``model_ref``, each run on the float64 truth's inputs to
    that module, forward and backward. The Report's ``ranking`` lists modules by their own
    worst ratio / limit, the module most wrong by itself first; ``str(report)`` starts
    with it. ``judge_options`` are those of ``judge()``."""
    for m in (model_test, model_ref):
        if not isinstance(m, torch.nn.Module):
            raise TypeError(f"isolate needs torch.nn.Module models, got {type(m).__name__}")
    # No fingerprints here: the three runs are made from one set of inputs, in this call.
    call = _module_copy(model_ref, torch.float64, device)
    args = _cast(_as_args(inputs), torch.float64, device)
    calls = _Calls(call, modules)
    handles = calls.hooks()
    try:
        with tf32_off():
            _forward_backward(call, args, seed)
    finally:
        for h in handles:
            h.remove()
    runs = {}
    with tf32_off():
        for role, model, role_dtype in (("truth", model_ref, torch.float64), ("ref", model_ref, dtype),
                                        ("test", model_test, dtype)):
            tensors, tags = _run_isolated(model, calls, role_dtype, device)
            runs[role] = Trace(tensors, metadata={"dtype_recipe": str(role_dtype).replace("torch.", ""),
                                                  "order": list(tensors), "tags": tags})
    # No first divergence here, where no module sees another's output: the core ranks the
    # modules by their own worst tensor instead.
    return _judge(runs["test"], runs["ref"], runs["truth"], module_ranking=True, **judge_options)
