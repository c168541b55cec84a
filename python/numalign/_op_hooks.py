"""_op_hooks.py: op-level recording for capture.trace_ops. Inside the selected modules, a
TorchDispatchMode (below autograd, so it sees the ATen ops that really run, forward and
backward) records each op's floating outputs, named after the module call and the op's
place in that call's sequence, with the recorded tensors it was computed from.

Names: forward ``MODULE/aten.OP#k``, backward ``MODULE/grad/aten.OP#k`` (``MODULE`` as
trace_model names a call: ``layers.0.mlp`` or ``layers.0.mlp#1`` for its second call; ``k``
counts the recorded ops of that call, from 0; an op with several tensor outputs records its
floating ones as ``...#k.0``, ``...#k.1``, by output position). An op belongs to the innermost
selected module running it. Backward ops belong to the module whose forward created the
autograd node running them (``torch._C._current_autograd_node()`` against the nodes each
forward op's outputs got). Autograd sums the gradients of a tensor used several times while
the node that produced one of them is current: that sum is recorded with that node's module
(``mlp/grad/aten.add#5`` after ``mlp.grad`` when the module's input is also used outside it),
alike in every run of the same code; a parameter used twice has that sum as its gradient.
Ops of nodes no selected module created (AccumulateGrad's, those of code outside the
modules) are not recorded.

Not recorded, as they compute nothing: views (``func.is_view``: view, t, transpose, expand,
slice, ...), ``detach``, ``alias``, ``clone``, ``_unsafe_view``, ``copy_`` and casts
(``_to_copy``). A float64 truth keeps float64 where the code casts down, and ``.to()`` to a
tensor's own dtype dispatches nothing, so casts do not appear in every run alike: recording
them would break op-by-op pairing. Their results stand for the tensor they came from (a
rounding cast's error shows in the op that consumes it). Ops whose results hold no values yet
(``empty``, ``empty_like``, ...) and ops without a floating result are not recorded either.

What an op was computed from (``inputs`` in the metadata) are the recorded tensors among its
arguments: earlier ops' results, the module's recorded inputs and received gradients, and
what views and casts of them stand for, known by the tensor object itself (a weak identity
map, so a freed tensor's reused memory is never mistaken for it). Parameters and buffers are
not recorded (the same in every run: their fingerprints are checked), nor is anything made
outside the dispatch mode's sight (a tensor autograd saved as an op's output and hands back
as a new object): such arguments are not listed, so the op's inputs read as passing on the
recorded ones only."""
from __future__ import annotations

import contextlib

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from torch.utils.weak import WeakIdKeyDictionary

from ._module_hooks import ModuleRecorder

# Ops whose result is their first tensor argument's values (copy_: its second's).
_STANDS_FOR_INPUT = {"detach", "alias", "lift_fresh", "clone", "_to_copy", "_unsafe_view",
                     "_reshape_alias", "copy_", "contiguous"}
# Ops whose result holds no values yet.
_UNINITIALIZED = {"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided",
                  "empty_permuted"}


def _tensors(tree):
    return [t for t in tree_flatten(tree)[0] if isinstance(t, torch.Tensor)]


class _OpMode(TorchDispatchMode):
    def __init__(self, recorder):
        super().__init__()
        self.recorder = recorder

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if not self.recorder._busy:
            self.recorder._on_op(func, args, kwargs, out)
        return out


class OpRecorder(ModuleRecorder):
    """A ModuleRecorder that also records, inside the selected modules, each op's outputs."""

    _HEADER_PER_MODULE = 64 << 10  # a few dozen ops per module call, forward and backward

    def __init__(self, model, globs, save_to, memory_budget=None):
        super().__init__(model, globs, save_to, memory_budget)
        self.selected = [p for p, _ in self._modules]
        self._busy = 0                    # > 0 while the recorder itself runs ops
        self._names = WeakIdKeyDictionary()  # tensor -> the recorded name it stands for
        self._op_counts = {}              # (path, call, backward) -> ops recorded so far
        self._node_owner = {}             # id(node) -> (node, (path, call))
        self._pending = []                # (tensor, (path, call)): grad_fn not read yet

    def record(self, name, tensor, **kwargs):
        self._busy += 1
        try:
            name = super().record(name, tensor, **kwargs)
        finally:
            self._busy -= 1
        self._names[tensor] = name
        return name

    @contextlib.contextmanager
    def ops(self):
        try:
            with _OpMode(self):
                yield self
            # The op whose result each parameter's gradient is (autograd hands it on, detached).
            self._grad_source = {f"grad.param.{n}": self._names.get(p.grad)
                                 for n, p in self._params if p.grad is not None}
        finally:
            self._pending.clear()
            self._node_owner.clear()

    def record_param_grads(self, grads):
        """As ModuleRecorder's, but a parameter's gradient that is one op's result as it was
        (one use of the parameter) is computed from that op's result."""
        super().record_param_grads(grads)
        for n in grads:
            source = getattr(self, "_grad_source", {}).get(n)
            if source is not None and self.tags.get(source, {}).get("kind") == "op-grad":
                self.inputs[n] = [source]

    def _resolve_pending(self):
        """The autograd node each forward op's outputs got (set once the op returned): its
        backward's ops belong to the same module call."""
        for t, key in self._pending:
            node = t.grad_fn
            if node is not None and id(node) not in self._node_owner:
                self._node_owner[id(node)] = (node, key)
        self._pending.clear()

    def _on_op(self, func, args, kwargs, out):
        self._resolve_pending()
        node = torch._C._current_autograd_node()
        if node is None:
            key, backward = (self._stack[-1] if self._stack else None), False
        else:
            owner = self._node_owner.get(id(node))
            key, backward = (owner[1] if owner is not None and owner[0] is node else None), True
        outs = _tensors(out)
        name = func.overloadpacket.__name__
        if func.is_view or name in _STANDS_FOR_INPUT:
            # Wherever it runs: the view autograd makes of a gradient before the module's
            # backward reads it, the detached gradient a parameter accumulates.
            ins = _tensors(args[1:2] if name == "copy_" else args[:1])
            source = self._names.get(ins[0]) if ins else None
            if source is not None:
                for t in outs:
                    self._names[t] = source
        if key is None:
            if not (func.is_view or name in _STANDS_FOR_INPUT):
                for t in outs:  # changed in place by code no module runs: no longer it
                    self._names.pop(t, None)
            return
        if not backward:
            self._pending.extend((t, key) for t in outs)
        if func.is_view or name in _STANDS_FOR_INPUT:
            return
        if name in _UNINITIALIZED or not any(t.is_floating_point() for t in outs):
            return
        froms = []
        for t in _tensors((args, kwargs)):
            n = self._names.get(t)
            if n is not None and n not in froms:
                froms.append(n)
        path, call = key
        count_key = (path, call, backward)
        k = self._op_counts.get(count_key, 0)
        self._op_counts[count_key] = k + 1
        op = f"{func.namespace}.{name}"
        stem = f"{self._base(path, call)}{'/grad' if backward else ''}/{op}#{k}"
        for i, t in enumerate(outs):
            if not t.is_floating_point():
                continue
            recorded = self.record(stem if len(outs) == 1 else f"{stem}.{i}", t, module=path,
                                   kind="op-grad" if backward else "op", call=call, inputs=froms)
            self.tags[recorded]["op"] = op
