"""_module_hooks.py: forward hooks that record what each module of a model received and
produced, in execution order, in memory or streamed to a file, and tensor hooks that record
the gradients each module received and passed upstream.

Inputs are recorded as data (``PATH.in``) rather than matched to the tensors that produced
them: the tensors between modules are often computed outside any module (a residual add),
and matching by address would mistake a freed tensor's reused memory for another.

Gradients come from hooks on the tensors a module was handed and returned, not from torch's
module backward hooks: those see positional arguments only (Hugging Face calls its modules
with keyword arguments), warn on ModelOutput results, and match calls to backward passes by
guesswork. Each call's inputs and outputs that need a gradient are passed on as views, and
the view's hook fires with the gradient of exactly that call's tensor."""
from __future__ import annotations

import contextlib
import copy
import json
import os

import torch

from . import _core
from ._runs import selected_modules
from ._tensors import flatten, to_core
from .trace import METADATA_KEY, Trace


def _tensors_of(obj, skipped=None):
    """{suffix: tensor} of a module's arguments, results or gradients: "" for a lone tensor
    (or a tuple of one), else ".0", ".1", ".key" (nested names joined by dots). With
    ``skipped`` (a dict), caches and values that cannot be judged are listed there, by
    suffix, instead of raising."""
    if isinstance(obj, (list, tuple)) and len(obj) == 1:
        obj = obj[0]
    if isinstance(obj, torch.Tensor):
        return {"": obj}
    inner = {} if skipped is not None else None
    flat = flatten(obj, skipped=inner) if obj is not None else {}
    if inner:
        skipped.update({f".{k}": why for k, why in inner.items()})
    return {f".{k}": v for k, v in flat.items() if isinstance(v, torch.Tensor)}


def _call_values(args, kwargs):
    """A module call's arguments as one value whose flattened names are the call's ``.in``
    suffixes: positional ones by index, keyword ones by name."""
    return list(args) + ([kwargs] if kwargs else [])


def _replace_tensors(obj, fn):
    """``obj`` with every tensor ``t`` replaced by ``fn(t)``, containers rebuilt as their own
    types (a ModelOutput stays a ModelOutput); anything else, a cache included, is kept."""
    if isinstance(obj, torch.Tensor):
        return fn(obj)
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):
        return type(obj)(*(_replace_tensors(v, fn) for v in obj))
    if isinstance(obj, (list, tuple)):
        return type(obj)(_replace_tensors(v, fn) for v in obj)
    if type(obj) is dict:
        return {k: _replace_tensors(v, fn) for k, v in obj.items()}
    if isinstance(obj, dict):  # OrderedDict, ModelOutput: a copy of the same type
        replaced = copy.copy(obj)
        for k, v in obj.items():
            new = _replace_tensors(v, fn)
            if new is not v:
                replaced[k] = new
        return replaced
    return obj


def watch_gradients(obj, names, on_grad):
    """``obj`` with each tensor of ``names`` ({suffix: tensor} from ``_tensors_of``) that
    needs a gradient replaced by a view of it; ``on_grad(suffix, grad)`` is called with the
    gradient of that view, the gradient of this use of the tensor. A tensor passed twice is
    one view (its gradient sums both uses)."""
    if not torch.is_grad_enabled():
        return obj
    suffix_of = {id(t): s for s, t in reversed(list(names.items()))
                 if t.requires_grad and (t.is_floating_point() or t.is_complex())}
    views = {}

    def wrap(t):
        suffix = suffix_of.get(id(t))
        if suffix is None:
            return t
        if id(t) not in views:
            v = t.view_as(t)
            v.register_hook(lambda g, s=suffix: on_grad(s, g))
            views[id(t)] = v
        return views[id(t)]

    return _replace_tensors(obj, wrap) if suffix_of else obj


def available_memory() -> int:
    """Bytes the system can still give this process (MemAvailable), or 0 when unknown."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def default_memory_budget() -> int:
    """Half of the memory available now: the run itself needs the rest."""
    available = available_memory()
    return available // 2 if available else 8 << 30


class RecordingBudgetExceeded(MemoryError):
    """A trace recorded in memory would pass its budget; ``save_to=`` streams it instead."""


class ModuleRecorder:
    def __init__(self, model: torch.nn.Module, globs, save_to, memory_budget=None):
        self._modules = selected_modules(model, globs)
        self._budget = None if save_to is not None else (
            default_memory_budget() if memory_budget is None else memory_budget)
        self._held = 0             # bytes of the tensors held in memory
        self._params = list(model.named_parameters())
        self._writer = None if save_to is None else _core.TraceStreamWriter(
            os.fspath(save_to), header_reserve=self._header_estimate())
        self._tensors = {}
        self.order, self.tags, self.inputs = [], {}, {}
        self.skipped = {}          # name -> why it was not recorded
        self._calls = {}           # path -> forward calls so far
        self._forward_inputs = {}  # (path, call) -> input names
        self._received = {}        # (path, call) -> names of the gradients it received so far
        self._stack = []           # forward calls in progress: (path, call)
        self._param_at = {}        # parameter name -> len(order) when its gradient was final

    # Bytes of header per selected module (its tensors' entries, tags, inputs and order
    # lines: about 2.3 KiB for a Llama layer's modules) and per parameter (its gradient and
    # fingerprint), with room to spare: a header that outgrows the reserve only costs a
    # rewrite of the file (TraceStreamWriter), never a wrong one.
    _HEADER_PER_MODULE, _HEADER_PER_PARAMETER = 6 << 10, 1 << 10

    def _header_estimate(self) -> int:
        # At most 64 MiB, well within the readers' cap on a header (100 MB).
        return min(64 << 20, (64 << 10) + self._HEADER_PER_MODULE * len(self._modules)
                   + self._HEADER_PER_PARAMETER * len(self._params))

    def record(self, name, tensor, *, module, kind, call=0, inputs=None, producer=None):
        if name in self.tags:
            raise ValueError(f"tensor {name!r} recorded twice")
        self._store(name, tensor.detach())
        self.order.append(name)
        self.tags[name] = {"module": module, "kind": kind, "call": str(call)}
        if producer is not None:
            self.tags[name]["producer"] = producer
        if inputs is not None:
            self.inputs[name] = list(inputs)
        return name

    def _store(self, name, t):
        """Writes the tensor's values as they are now (the writer copies them; in memory, a
        clone): later in-place updates by the model must not change what was recorded."""
        if self._writer is not None:
            self._writer.add(name, to_core(t, name))
        else:
            self._hold(name, t)
            self._tensors[name] = t.clone()

    def _hold(self, name, t):
        """Counts a tensor against the budget; refuses, before copying it, one that would
        pass it."""
        size = t.numel() * t.element_size()
        if self._held + size > self._budget:
            raise RecordingBudgetExceeded(
                f"recording {name!r} ({size:,} bytes) would take the trace held in memory past "
                f"its budget of {self._budget:,} bytes ({self._held:,} held, "
                f"{len(self._tensors)} tensors): pass save_to=PATH to stream the trace to a file "
                "(recording then holds nothing but 8 MiB of write buffers), select fewer modules with "
                "modules=[...], or raise memory_budget=")
        self._held += size

    @staticmethod
    def _base(path, call):
        return path if call == 0 else f"{path}#{call}"

    def _named(self, base, values):
        """{suffix: tensor} of ``values``; what cannot be recorded is listed in skipped."""
        skipped = {}
        named = _tensors_of(values, skipped)
        for suffix, why in skipped.items():
            self.skipped[base + suffix] = why
        return named

    def _pre_hook(self, path):
        def hook(module, args, kwargs):
            call = self._calls.get(path, 0)
            self._calls[path] = call + 1
            key, base = (path, call), self._base(path, call)
            # Its inputs were computed by the code of the module around it, from that
            # module's own inputs (or by the model's code, outside every module).
            outer = self._stack[-1] if self._stack else None
            around = ("", []) if outer is None else (outer[0], self._forward_inputs[outer])
            named = self._named(f"{base}.in", _call_values(args, kwargs))
            self._forward_inputs[key] = [
                self.record(f"{base}.in{s}", t, module=path, kind="input", call=call,
                            producer=around[0], inputs=around[1]) for s, t in named.items()]
            self._received[key] = []
            self._stack.append(key)

            def passed_upstream(suffix, grad):  # the gradient it passes to its input
                self.record(f"{base}.grad{suffix}", grad, module=path, kind="grad", call=call,
                            inputs=self._received[key] + self._forward_inputs[key])
            if kwargs:
                values = watch_gradients(_call_values(args, kwargs), named, passed_upstream)
                return tuple(values[:-1]), values[-1]
            return tuple(watch_gradients(list(args), named, passed_upstream)), kwargs
        return hook

    def _forward_hook(self, path):
        def hook(module, args, kwargs, output):
            key = self._stack.pop()
            call, base = key[1], self._base(*key)
            named = self._named(f"{base}.out", output)
            for s, t in named.items():
                self.record(f"{base}.out{s}", t, module=path, kind="output", call=call,
                            inputs=self._forward_inputs[key])
            around = self._stack[-1][0] if self._stack else ""

            def received(suffix, grad):
                # Computed by the backward of the code around it, from what that code saved.
                self._received[key].append(self.record(
                    f"{base}.grad_out{suffix}", grad, module=path, kind="grad-output", call=call,
                    producer=around, inputs=self._forward_inputs[key]))
            return watch_gradients(output, named, received)
        return hook

    def _param_hook(self, name):
        def hook(p):
            self._param_at[name] = len(self.order)
        return hook

    @contextlib.contextmanager
    def hooked(self):
        handles = []
        try:
            for path, m in self._modules:
                handles.append(m.register_forward_pre_hook(self._pre_hook(path), with_kwargs=True))
                handles.append(m.register_forward_hook(self._forward_hook(path), with_kwargs=True))
            for name, p in self._params:
                if p.requires_grad:
                    handles.append(p.register_post_accumulate_grad_hook(self._param_hook(name)))
            yield self
        finally:
            for h in handles:
                h.remove()

    def record_param_grads(self, grads):
        """Records {"grad.param.NAME": grad} and places each in the execution order where the
        parameter's gradient became final, so that a wrong weight gradient counts in the
        first divergence of the backward pass: computed by its module from the gradients the
        module received and its inputs."""
        at = {}
        for n, g in grads.items():
            pname = n[len("grad.param."):]
            owner = pname.rpartition(".")[0]
            froms = [x for (p, _), names in self._received.items() if p == owner for x in names]
            froms += [x for (p, _), names in self._forward_inputs.items() if p == owner for x in names]
            self.record(n, g, module=owner, kind="param-grad", inputs=froms)
            at[n] = self._param_at.get(pname, len(self.order))
        position = {n: (i, 1) for i, n in enumerate(self.order)}
        position.update({n: (p, 0) for n, p in at.items()})
        self.order.sort(key=position.__getitem__)

    def finish(self, metadata) -> Trace:
        if self._writer is None:  # in execution order, as the metadata records it
            return Trace({n: self._tensors[n] for n in self.order}, metadata=metadata)
        self._writer.close({METADATA_KEY: json.dumps(metadata, separators=(",", ":"))})
        return Trace.load(self._writer.path)

    def abort(self):
        if self._writer is not None:
            self._writer.abort()

