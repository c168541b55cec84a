"""_precision.py: a float64 truth that stays float64. Model code often computes parts of a
model in float32 whatever its input (Hugging Face's RMSNorm and rotary embeddings cast to
float32; ``.float()``, ``dtype=torch.float32``, fp32-only kernels). In the truth run that
makes those parts only float32-accurate, and nothing would say so. The truth run is watched
op by op below autograd (a TorchDispatchMode): every floating result of less than float64
is recorded with the module that ran it; in "keep" mode (the default) casts down and dtype
arguments of less than float64 are raised to float64, floating buffers are float64, and
factories default to float64, so the truth computes what the model means, in float64."""
from __future__ import annotations

import contextlib

import torch
from torch.utils._python_dispatch import TorchDispatchMode

MODES = ("keep", "watch")


def check_mode(mode):
    if mode not in MODES:
        raise ValueError(f"float64_truth must be one of {', '.join(MODES)}, got {mode!r}")


def cast_buffers_to_float64(module):
    """Floating buffers (rotary frequencies, running statistics) as float64: part of the
    model's state, like its parameters, which the truth's copy already holds in float64."""
    for m in module.modules():
        for name, b in m.named_buffers(recurse=False):
            if b is not None and b.is_floating_point() and b.dtype != torch.float64:
                setattr(m, name, b.to(torch.float64))


# Ops that only alias or hand on a tensor: they compute nothing in any precision.
_NOT_COMPUTING = {"detach", "alias", "lift_fresh", "clone"}


class _Float64Watch(TorchDispatchMode):
    def __init__(self, keep: bool):
        super().__init__()
        self.keep = keep
        self.module = ""        # the innermost module running, "" for the model's own code
        self.low = {}           # module -> {"op (dtype)": count}: computed in less than float64
        self.raised = {}        # module -> {"op (dtype)": count}: dtype arguments raised to float64

    @staticmethod
    def _note(book, module, func, dtype):
        ops = book.setdefault(module, {})
        key = f"{func.overloadpacket.__name__} ({str(dtype).replace('torch.', '')})"
        ops[key] = ops.get(key, 0) + 1

    def _where(self):
        # Backward runs no module hooks: its ops are listed under "(backward)".
        return "(backward)" if torch._C._current_autograd_node() is not None else self.module

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        wanted = kwargs.get("dtype")
        if (self.keep and isinstance(wanted, torch.dtype) and wanted.is_floating_point
                and wanted != torch.float64):
            self._note(self.raised, self._where(), func, wanted)
            kwargs = {**kwargs, "dtype": torch.float64}
        out = func(*args, **kwargs)
        if func.is_view or func.overloadpacket.__name__ in _NOT_COMPUTING:
            return out
        for t in (out if isinstance(out, (list, tuple)) else (out,)):
            if isinstance(t, torch.Tensor) and t.is_floating_point() and t.dtype != torch.float64:
                self._note(self.low, self._where(), func, t.dtype)
        return out


def _summary(book):
    return {m: [f"{op} x{n}" if n > 1 else op for op, n in ops.items()] for m, ops in book.items()}


@contextlib.contextmanager
def float64_truth(model, mode: str):
    """Watches (and in "keep" mode raises to float64) the truth run of ``model`` (a module
    or None); yields a dict that, once the block ends, holds what the trace metadata records:
    {"mode", "below_float64": {module: [op (dtype) xN]}, "raised": {...}}."""
    check_mode(mode)
    paths = {id(m): p for p, m in model.named_modules()} if model is not None else {}
    watch = _Float64Watch(keep=mode == "keep")
    stack = []

    def enter(module, args):
        if id(module) in paths:
            stack.append(watch.module)
            watch.module = paths[id(module)]

    def leave(module, args, output):
        if id(module) in paths and stack:
            watch.module = stack.pop()

    from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook

    handles = [register_module_forward_pre_hook(enter), register_module_forward_hook(leave)]
    default = torch.get_default_dtype()
    if mode == "keep":
        torch.set_default_dtype(torch.float64)
    result = {"mode": mode}
    try:
        with watch:
            yield result
    finally:
        torch.set_default_dtype(default)
        for h in handles:
            h.remove()
    result["below_float64"] = _summary(watch.low)
    result["raised"] = _summary(watch.raised)
