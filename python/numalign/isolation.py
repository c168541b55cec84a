"""isolation.py: each module judged on its own. A whole-model trace shows where the error
first appears; isolation answers a different question, how wrong each module is by itself:
every module of the test and of the reference runs on the float64 truth's inputs to that
module (cast to the dtype) and, backward, on the truth's gradient into it, so no module
inherits the error of the modules before it.

The truth's gradients are those of one float64 forward and backward of the whole model with
the fixed upstream gradients on its outputs; a cache the model returns gets none (state it
filled, and no module run alone fills one). The truth role's own tensors come from that same
run (see _TruthRun); the reference and the test rerun each call on its own."""
from __future__ import annotations

import torch

from ._module_hooks import _call_values, _replace_tensors, _tensors_of, watch_gradients
from . import _precision
from ._runs import _as_args, _cast, _forward_backward, _module_copy, selected_modules, tf32_off
from ._tensors import CACHE_STATE, is_hf_cache
from .api import _judge
from .report import Report
from .trace import Trace


class _Call:
    """One call of a selected module in the truth run. The other roles rerun it from
    ``args``/``kwargs`` (float64 copies) and ``grad_out`` (the gradients its outputs
    received, by output suffix); the truth role's tensors for it are taken from the run
    (``outputs``, ``input_grads``, ``param_grads``) unless ``rerun`` says why they cannot be."""

    def __init__(self, path, k, args, kwargs):
        self.path, self.k, self.args, self.kwargs = path, k, args, kwargs
        self.grad_out = {}
        self.outputs, self.input_grads, self.param_grads = {}, {}, {}
        self.input_names, self.param_names = [], []
        self.swapped = []   # (module, parameter key, tensor it held) while the call runs
        self.rerun = None   # why the truth of this call is rerun on its own, or None

    @property
    def base(self):
        return self.path if self.k == 0 else f"{self.path}#{self.k}"


class _TruthRun:
    """The float64 truth run of isolation, one forward and backward of the whole model,
    which records every call of the selected modules (what the other roles rerun) and
    takes the truth role's tensors from that same run: a call rerun on its own, on the
    truth's inputs to it, computes what the call computed in the run.

    Forward, each call's floating inputs and its modules' parameters are handed to it as
    new tensors of their own (a view of a tensor that needs a gradient, a leaf copy of one
    that does not), and their hooks receive the gradient of this call's use alone: what a
    rerun's leaves would hold. Parameters are swapped in the modules' ``_parameters`` for
    the call and put back after it, nested calls inside enclosing ones.

    The leaves made for inputs that need no gradient in the model are the one thing the
    run does that the model does not: a module output that needs a gradient only because
    of them would receive one that no rerun gives it. Such a call's truth is rerun on its
    own, and the gradient its output received is not recorded for the other roles."""

    def __init__(self, model, globs):
        self.modules = selected_modules(model, globs)
        self.calls = []        # every _Call, in forward order
        self._count, self._stack = {}, []
        self._leaves = set()   # ids of the leaves made for inputs that need no gradient
        self._held = []        # those leaves, kept alive so that their ids stay theirs
        self._reaches_model = {}  # autograd node -> whether a leaf of the model's is upstream

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
            call = _Call(path, k, a, kw)
            self.calls.append(call)
            self._stack.append(call)
            if not torch.is_grad_enabled():
                call.rerun = "called without gradients"
                return None
            values = _call_values(args, kwargs)
            low = [s for s, t in _tensors_of(values, {}).items()
                   if t.is_floating_point() and t.dtype != torch.float64]
            if low:  # a rerun casts its inputs to float64: it computes something else
                call.rerun = f"input{low[0]} is not float64 in the run"
                return None
            values = self._own_inputs(call, values)
            self._own_parameters(call, module)
            return (tuple(values[:-1]), values[-1]) if kwargs else (tuple(values), kwargs)
        return hook

    def _own_inputs(self, call, values):
        made = set()

        def own(t):
            if not t.is_floating_point():
                return t
            if t.requires_grad:
                mine = t.view_as(t)
            else:
                mine = t.detach().clone().requires_grad_()
                self._leaves.add(id(mine))
                self._held.append(mine)
            made.add(id(mine))
            return mine

        values = _replace_tensors(values, own)
        for suffix, t in _tensors_of(values, {}).items():
            if id(t) in made:
                call.input_names.append(suffix)
                t.register_hook(lambda g, s=suffix: _keep_grad(call.input_grads, s, g))
        return values

    def _own_parameters(self, call, module):
        named = [(n, p) for n, p in module.named_parameters() if p.requires_grad]
        views = {}
        for sub in module.modules():
            for key, p in sub._parameters.items():
                if p is not None and p.requires_grad:
                    if id(p) not in views:
                        views[id(p)] = p.view_as(p)
                    call.swapped.append((sub, key, p))
                    sub._parameters[key] = views[id(p)]
        for name, p in named:
            call.param_names.append(name)
            views[id(p)].register_hook(lambda g, n=name: _keep_grad(call.param_grads, n, g))

    def _post(self, path):
        def hook(module, args, kwargs, output):
            call = self._stack.pop()
            for sub, key, p in reversed(call.swapped):
                sub._parameters[key] = p
            call.swapped = []
            skipped = {}
            outputs = _tensors_of(output, skipped)
            hidden = [s for s, why in skipped.items() if not why.endswith(CACHE_STATE)]
            if hidden and call.rerun is None:  # its tensors' gradients would reach the call
                call.rerun = f"output{hidden[0]} holds tensors no rerun receives a gradient for"
            call.outputs = {s: t.detach().clone() for s, t in outputs.items()}
            from_model = {s: t for s, t in outputs.items() if self._needs_grad_in_model(t)}
            added = [s for s, t in outputs.items() if t.requires_grad and s not in from_model]
            if added and call.rerun is None:
                call.rerun = f"output{added[0]} needs a gradient only through the leaves made"
            return watch_gradients(output, from_model,
                                   lambda s, g: _keep_grad(call.grad_out, s, g))
        return hook

    def _needs_grad_in_model(self, t):
        """Whether ``t`` needs a gradient in the model as it is, not only because of the
        leaves made for inputs that need none: a leaf of the model's own is upstream."""
        if not t.requires_grad:
            return False
        if not self._leaves:
            return True
        if t.grad_fn is None:
            return id(t) not in self._leaves
        return self._reaches_model_leaf(t.grad_fn)

    def _reaches_model_leaf(self, root):
        # Depth first through the autograd graph, each node's answer remembered.
        memo = self._reaches_model
        if root in memo:
            return memo[root]
        stack = [(root, iter(root.next_functions))]
        while stack:
            node, children = stack[-1]
            for child, _ in children:
                if child is None:
                    continue
                known = memo.get(child)
                if known is None:
                    leaf = getattr(child, "variable", None)  # an AccumulateGrad node
                    if leaf is None:
                        stack.append((child, iter(child.next_functions)))
                        break
                    known = memo[child] = id(leaf) not in self._leaves
                if known:
                    for n, _ in stack:
                        memo[n] = True
                    return True
            else:
                memo[node] = False
                stack.pop()
        return False

    def hooks(self):
        handles = []
        for path, m in self.modules:
            handles.append(m.register_forward_pre_hook(self._pre(path), with_kwargs=True))
            handles.append(m.register_forward_hook(self._post(path), with_kwargs=True))
        return handles

    def truth(self, rerun):
        """({name: tensor}, tags) of the truth role, in the order a rerun of every call
        gives them: each call's from the run, or from ``rerun`` {call: (tensors, tags)}."""
        tensors, tags = {}, {}

        def keep(name, t, path, kind):
            tensors[name] = t
            tags[name] = {"module": path, "kind": kind}

        for call in self.calls:
            if call.rerun is not None:
                again, again_tags = rerun[call]
                tensors.update(again)
                tags.update(again_tags)
                continue
            for suffix, t in call.outputs.items():
                keep(f"{call.base}.out{suffix}", t, call.path, "output")
            for suffix in call.input_names:
                if suffix in call.input_grads:
                    keep(f"{call.base}.grad{suffix}", call.input_grads[suffix], call.path, "grad")
            for name in call.param_names:
                if name in call.param_grads:
                    keep(f"{call.base}.grad.param.{name}", call.param_grads[name], call.path,
                         "param-grad")
        return tensors, tags


def _keep_grad(book, key, grad):
    book[key] = grad.detach().clone()


class _RecordedTruth:
    """What isolation's truth run gives: the calls, and the truth role's trace contents."""

    def __init__(self, calls, tensors, tags, precision, rerun):
        self.calls, self.tensors, self.tags = calls, tensors, tags
        self.precision, self.rerun = precision, rerun


def _record_truth(model, inputs, globs, device, mode, seed=0):
    """Runs ``model`` forward and backward once in float64, the truth of isolation: every
    call of the selected modules, and the truth role's tensors for each of them (rerun on
    its own where the run cannot give them)."""
    copied = _module_copy(model, torch.float64, device, mode)
    args = _cast(_as_args(inputs), torch.float64, device)
    run = _TruthRun(copied, globs)
    handles = run.hooks()
    try:
        with tf32_off(), _precision.float64_truth(copied, mode) as precision:
            _forward_backward(copied, args, seed, into_caches=False)
    finally:
        for h in handles:
            h.remove()
    rerun = {}
    to_rerun = [c for c in run.calls if c.rerun is not None]
    if to_rerun:
        # Their computations are the run's own, watched there: the run's precision record
        # already lists them.
        again = _module_copy(model, torch.float64, device, mode)
        with tf32_off(), _precision.float64_truth(again, mode):
            rerun = {c: _run_calls(again, [c], torch.float64, device) for c in to_rerun}
    tensors, tags = run.truth(rerun)
    return _RecordedTruth(run.calls, tensors, tags, precision, [c.base for c in to_rerun])


def _run_isolated(model, calls, dtype, device, mode):
    """Runs each recorded call on a copy of ``model`` in ``dtype``: {name: tensor}, tags, and
    for float64 the truth's precision record (see _precision.py)."""
    if dtype == torch.float64:
        copied = _module_copy(model, torch.float64, device, mode)
        with _precision.float64_truth(copied, mode) as precision:
            tensors, tags = _run_calls(copied, calls, dtype, device)
        return tensors, tags, precision
    return (*_run_calls(_module_copy(model, dtype, device), calls, dtype, device), None)


def _run_calls(copied, calls, dtype, device):
    by_path = dict(copied.named_modules())
    tensors, tags = {}, {}

    def keep(name, t, path, kind):
        tensors[name] = t.detach().clone()
        tags[name] = {"module": path, "kind": kind}

    for call in calls:
        module = by_path[call.path]
        module.zero_grad(set_to_none=True)
        a, kw = _cast((call.args, call.kwargs), dtype, device)
        base = call.base
        out = module(*a, **kw)
        outs = _tensors_of(out, {})
        for suffix, t in outs.items():
            keep(f"{base}.out{suffix}", t, call.path, "output")
        grads = call.grad_out
        pairs = [(t, grads[s]) for s, t in outs.items() if s in grads and t.requires_grad]
        if pairs:
            torch.autograd.backward([t for t, _ in pairs], [g.to(t.dtype) for t, g in pairs])
            # Named as trace_model names them: positional inputs by index, keyword ones by name.
            for suffix, x in _tensors_of(_call_values(a, kw), {}).items():
                if x.grad is not None:
                    keep(f"{base}.grad{suffix}", x.grad, call.path, "grad")
            for pname, p in module.named_parameters():
                if p.grad is not None:
                    keep(f"{base}.grad.param.{pname}", p.grad, call.path, "param-grad")
    return tensors, tags


def _isolated_trace(tensors, tags, dtype, precision):
    metadata = {"dtype_recipe": str(dtype).replace("torch.", ""), "order": list(tensors),
                "tags": tags}
    if precision:
        metadata["below_float64"] = precision["below_float64"]
    return Trace(tensors, metadata=metadata)


def isolate(model_test, model_ref, inputs, dtype, *, modules=None, seed: int = 0, device="cpu",
            float64_truth: str = "keep", **judge_options) -> Report:
    """Judges every selected module (globs on module paths; default all) of ``model_test``
    against the same module of ``model_ref``, each run on the float64 truth's inputs to
    that module, forward and backward. The Report's ``ranking`` lists modules by their own
    worst ratio / limit, the module most wrong by itself first; ``str(report)`` starts
    with it. The truth's runs stay float64 as in ``capture.run_fwd_bwd`` (``float64_truth``).
    ``judge_options`` are those of ``judge()``."""
    _precision.check_mode(float64_truth)
    for m in (model_test, model_ref):
        if not isinstance(m, torch.nn.Module):
            raise TypeError(f"isolate needs torch.nn.Module models, got {type(m).__name__}")
    past = [n for n, v in (inputs.items() if isinstance(inputs, dict) else enumerate(_as_args(inputs)))
            if is_hf_cache(v)]
    if past:
        raise ValueError(f"isolate runs each module on one forward pass over the inputs; input "
                         f"{past[0]!r} is a cache of earlier tokens, which a module run alone "
                         "cannot use: pass the whole sequence and no cache")
    # No fingerprints here: the three runs are made from one set of inputs, in this call.
    truth = _record_truth(model_ref, inputs, modules, device, float64_truth, seed)
    runs = {"truth": _isolated_trace(truth.tensors, truth.tags, torch.float64, truth.precision)}
    with tf32_off():
        for role, model in (("ref", model_ref), ("test", model_test)):
            tensors, tags, _ = _run_isolated(model, truth.calls, dtype, device, float64_truth)
            runs[role] = _isolated_trace(tensors, tags, dtype, None)
    # No first divergence here, where no module sees another's output: the core ranks the
    # modules by their own worst tensor instead.
    return _judge(runs["test"], runs["ref"], runs["truth"], module_ranking=True, **judge_options)
