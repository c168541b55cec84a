"""_module_hooks.py: forward and backward hooks that record what each module of a model
received and produced, in execution order, in memory or streamed to a file.

Inputs are recorded as data (``PATH.in``) rather than matched to the tensors that produced
them: the tensors between modules are often computed outside any module (a residual add),
and matching by address would mistake a freed tensor's reused memory for another."""
from __future__ import annotations

import contextlib
import json
import os

import torch

from . import _core
from ._runs import selected_modules
from ._tensors import flatten, to_core
from .trace import METADATA_KEY, Trace


def _tensors_of(obj):
    """{suffix: tensor} of a module's arguments, results or gradients: "" for a lone tensor
    (or a tuple of one, as gradients come), else ".0", ".1", ".key" (nested names joined by
    dots)."""
    if isinstance(obj, (list, tuple)) and len(obj) == 1:
        obj = obj[0]
    if isinstance(obj, torch.Tensor):
        return {"": obj}
    flat = flatten(obj) if obj is not None else {}
    return {f".{k}": v for k, v in flat.items() if isinstance(v, torch.Tensor)}


class ModuleRecorder:
    def __init__(self, model: torch.nn.Module, globs, save_to):
        self._modules = selected_modules(model, globs)
        self._writer = _core.TraceStreamWriter(os.fspath(save_to)) if save_to is not None else None
        self._tensors = {}
        self.order, self.tags, self.inputs = [], {}, {}
        self._calls = {}           # path -> forward calls so far
        self._pending = {}         # path -> calls awaiting their backward, latest last
        self._forward_inputs = {}  # (path, call) -> input names
        self._enclosing = {}       # (path, call) -> (module, its input names) around the call
        self._stack = []           # forward calls in progress: (path, call)

    def record(self, name, tensor, *, module, kind, call=0, inputs=None, producer=None):
        if name in self.tags:
            raise ValueError(f"tensor {name!r} recorded twice")
        t = tensor.detach()
        if self._writer is not None:
            self._writer.add(name, to_core(t, name))
        else:
            self._tensors[name] = t.clone()  # later in-place updates must not change it
        self.order.append(name)
        self.tags[name] = {"module": module, "kind": kind, "call": str(call)}
        if producer is not None:
            self.tags[name]["producer"] = producer
        if inputs is not None:
            self.inputs[name] = list(inputs)
        return name

    def _record_all(self, base, values, **tags):
        return [self.record(base + suffix, t, **tags) for suffix, t in _tensors_of(values).items()]

    @staticmethod
    def _base(path, call):
        return path if call == 0 else f"{path}#{call}"

    def _pre_hook(self, path):
        def hook(module, args, kwargs):
            call = self._calls.get(path, 0)
            self._calls[path] = call + 1
            # Its inputs were computed by the code of the module around it, from that
            # module's own inputs (or by the model's code, outside every module).
            outer = self._stack[-1] if self._stack else None
            around = ("", []) if outer is None else (outer[0], self._forward_inputs[outer])
            values = list(args) + ([kwargs] if kwargs else [])
            names = self._record_all(f"{self._base(path, call)}.in", values, module=path,
                                     kind="input", call=call, producer=around[0],
                                     inputs=around[1])
            self._forward_inputs[(path, call)] = names
            self._enclosing[(path, call)] = around[0]
            self._pending.setdefault(path, []).append(call)
            self._stack.append((path, call))
        return hook

    def _forward_hook(self, path):
        def hook(module, args, kwargs, output):
            path_call = self._stack.pop()
            call = path_call[1]
            self._record_all(f"{self._base(path, call)}.out", output, module=path, kind="output",
                             call=call, inputs=self._forward_inputs[path_call])
        return hook

    def _backward_hook(self, path):
        def hook(module, grad_input, grad_output):
            # Backward runs the calls in reverse: the latest forward call not yet seen.
            pending = self._pending.get(path)
            call = pending.pop() if pending else 0
            base = self._base(path, call)
            forward_in = self._forward_inputs.get((path, call), [])
            # The gradient it received was computed by the backward of the code around it,
            # from the activations that code saved.
            received = self._record_all(f"{base}.grad_out", grad_output, module=path,
                                        kind="grad-output", call=call,
                                        producer=self._enclosing.get((path, call), ""),
                                        inputs=forward_in)
            self._record_all(f"{base}.grad", grad_input, module=path, kind="grad", call=call,
                             inputs=received + forward_in)
        return hook

    @contextlib.contextmanager
    def hooked(self):
        handles = []
        try:
            for path, m in self._modules:
                handles.append(m.register_forward_pre_hook(self._pre_hook(path), with_kwargs=True))
                handles.append(m.register_forward_hook(self._forward_hook(path), with_kwargs=True))
                handles.append(m.register_full_backward_hook(self._backward_hook(path)))
            yield self
        finally:
            for h in handles:
                h.remove()

    def finish(self, metadata) -> Trace:
        if self._writer is None:
            return Trace(self._tensors, metadata=metadata)
        self._writer.close({METADATA_KEY: json.dumps(metadata, separators=(",", ":"))})
        return Trace.load(self._writer.path)

    def abort(self):
        if self._writer is not None:
            self._writer.abort()
