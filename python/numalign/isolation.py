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

import contextlib

import torch
from torch.autograd.graph import get_gradient_edge

from ._module_hooks import _call_values, _replace_tensors, _tensors_of, watch_gradients
from . import _precision
from ._runs import (_as_args, _cast, _forward_backward, _module_copy, selected_modules, tf32_off,
                    watch_randomness)
from ._tensors import is_hf_cache
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
        self.made = []           # the tensors handed to the call, with their versions
        self.swapped = []        # (module, parameter key, tensor it held) while it runs
        self.window = None       # (first, last) sequence numbers of the nodes it made
        self.output_nodes = []   # the nodes of the views its outputs were passed on as
        self.rerun = None        # why the truth of this call is rerun on its own, or None

    @property
    def base(self):
        return self.path if self.k == 0 else f"{self.path}#{self.k}"

    def cannot_take(self, why):
        if self.rerun is None:
            self.rerun = why


class _TruthRun:
    """The float64 truth run of isolation, one forward and backward of the whole model,
    which records every call of the selected modules (what the other roles rerun) and
    takes the truth role's tensors from that same run where they are what a rerun of the
    call on its own would compute.

    Forward, each call's floating inputs and its modules' parameters are handed to it as
    tensors of its own (a view of a tensor that needs a gradient, a leaf copy of one that
    does not; parameters swapped in the modules' ``_parameters`` for the call), and their
    hooks receive the gradient of this call's use alone: what a rerun's leaves would hold.

    That holds only if the call computes as a rerun would, and its gradient reaches the
    call through its outputs alone. A call is rerun on its own where that is not shown:
    - before it runs: no gradients, or inside backward (a checkpoint's recompute); an
      input below float64 (a rerun casts it); hooks of others on its modules (a rerun runs
      them again, or they read parameters before the swap);
    - as it ends: a tensor handed to it changed in place;
    - between forward and backward, on the autograd graph: a path from the model's outputs
      to a tensor handed to the call that does not pass through the call's outputs (a
      tensor kept and returned, an output that needs a gradient only through the leaves
      made, a gradient taken inside forward), or a path from the call's outputs to a node
      made before the call other than through what it was handed (a parameter read
      outside ``_parameters``, a tied one used by a module outside the call)."""

    def __init__(self, model, globs):
        self.modules = selected_modules(model, globs)
        self.calls = []        # every _Call, in forward order
        self._count, self._stack = {}, []
        self._hook_ids = set()  # ids of this run's own module hooks
        self._leaves = set()   # ids of the leaves made for inputs that need no gradient
        self._held = []        # those leaves, kept alive so that their ids stay theirs
        self._reaches_model = {}  # autograd node -> whether a leaf of the model's is upstream
        self._probe = torch.zeros((), requires_grad=True)

    def _sequence_number(self):
        """The sequence number the next autograd node made on this thread gets, about."""
        return self._probe.view_as(self._probe).grad_fn._sequence_nr()

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
            values = _call_values(args, kwargs)
            call.rerun = self._why_not_from_the_run(module, values)
            if call.rerun is not None:
                return None
            first = self._sequence_number()
            values = self._own_inputs(call, values)
            self._own_parameters(call, module)
            call.window = (first, None)
            return (tuple(values[:-1]), values[-1]) if kwargs else (tuple(values), kwargs)
        return hook

    def _why_not_from_the_run(self, module, values):
        if not torch.is_grad_enabled():
            return "called without gradients"
        if torch._C._current_autograd_node() is not None:
            return "called inside backward (a recompute)"
        low = [s for s, t in _tensors_of(values, {}).items()
               if t.is_floating_point() and t.dtype != torch.float64]
        if low:
            return f"input{low[0]} is not float64 in the run"
        for m in module.modules():
            for hooks in (m._forward_pre_hooks, m._forward_hooks, m._backward_pre_hooks,
                          m._backward_hooks):
                if any(i not in self._hook_ids for i in hooks):
                    return "its modules have hooks of others"
        return None

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
                call.made.append((t, t._version))
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
                        call.made.append((views[id(p)], views[id(p)]._version))
                    call.swapped.append((sub, key, p))
                    sub._parameters[key] = views[id(p)]
        for name, p in named:
            call.param_names.append(name)
            views[id(p)].register_hook(
                lambda g, n=name: _keep_grad(call.param_grads, n, g))

    def _post(self, path):
        def hook(module, args, kwargs, output=None):
            if not self._stack or self._stack[-1].path != path:
                return None  # called after a raise before this run's pre-hook ran
            call = self._stack.pop()
            for sub, key, p in reversed(call.swapped):
                sub._parameters[key] = p
            call.swapped = []
            if any(t._version != v for t, v in call.made):
                call.cannot_take("a tensor handed to it changed in place")
            outputs = _tensors_of(output, {})
            call.outputs = {s: t.detach().clone() for s, t in outputs.items()}
            from_model = {s: t for s, t in outputs.items() if self._needs_grad_in_model(t)}
            passed_on = watch_gradients(output, from_model,
                                        lambda s, g: _keep_grad(call.grad_out, s, g))
            if call.rerun is None:
                views = _tensors_of(passed_on, {})
                call.output_nodes = [views[s].grad_fn for s in from_model]
                call.window = (call.window[0], self._sequence_number())
            return passed_on
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

    def check_the_graph(self, roots):
        """Between forward and backward: marks for a rerun each call whose gradient could
        come other than through its outputs, or reach more than what it was handed."""
        self._reaches_model.clear()
        taken = [c for c in self.calls if c.rerun is None]
        for call, why in _paths_around_calls(taken, roots):
            call.cannot_take(why)

    def hooks(self):
        handles = []
        for path, m in self.modules:
            handles.append(m.register_forward_pre_hook(self._pre(path), with_kwargs=True))
            handles.append(m.register_forward_hook(self._post(path), with_kwargs=True,
                                                   always_call=True))
        self._hook_ids = {h.id for h in handles}
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

    def open_calls(self):
        return [c.base for c in self._stack]


def _keep_grad(book, key, grad):
    book[key] = grad.detach().clone()


def _paths_around_calls(calls, roots):
    """[(call, why)] for the calls (each with ``made``, ``output_nodes`` and ``window``)
    that the autograd graph below ``roots`` reaches other than through their outputs, or
    whose outputs reach a node made before the call other than through what was handed to
    it. One pass over the graph in topological order, each node carrying two sets of calls
    (bit masks): those it is reached from the roots for without passing that call's
    outputs, and those whose outputs reach it without passing what was handed to them."""
    if not calls:
        return []
    made_of, output_of = {}, {}
    for i, call in enumerate(calls):
        for t, _ in call.made:
            node = get_gradient_edge(t).node
            made_of[node] = made_of.get(node, 0) | 1 << i
        for node in call.output_nodes:
            output_of[node] = output_of.get(node, 0) | 1 << i
    starts = [r.grad_fn if r.grad_fn is not None else get_gradient_edge(r).node for r in roots]
    order = _topological_order(starts)
    everyone = (1 << len(calls)) - 1
    around = dict.fromkeys(starts, everyone)  # reached from the roots, around the call's outputs
    beyond = {}                                # reached from the call's outputs, not via made
    found = {}
    for node in order:
        made, out = made_of.get(node, 0), output_of.get(node, 0)
        a = around.get(node, 0)
        b = beyond.get(node, 0) | out
        for i in _bits(a & made):
            found.setdefault(i, "its gradient also comes other than through its outputs")
        if not made:  # what was handed to a call inside it (a leaf copy too) is its own
            for i in _bits(b & ~out):
                first, last = calls[i].window
                if not first <= node._sequence_nr() <= last:
                    found.setdefault(i, "its outputs depend on more than what it was handed")
        a &= ~out
        b &= ~made
        for child, _ in node.next_functions:
            if child is not None:
                if a:
                    around[child] = around.get(child, 0) | a
                if b:
                    beyond[child] = beyond.get(child, 0) | b
    return [(calls[i], why) for i, why in sorted(found.items())]


def _bits(mask):
    while mask:
        low = mask & -mask
        yield low.bit_length() - 1
        mask ^= low


def _topological_order(starts):
    """The autograd nodes below ``starts``, each after every node above it."""
    parents, seen, stack = {}, set(starts), list(starts)
    while stack:
        node = stack.pop()
        for child, _ in node.next_functions:
            if child is None:
                continue
            parents[child] = parents.get(child, 0) + 1
            if child not in seen:
                seen.add(child)
                stack.append(child)
    ready = [n for n in seen if n not in parents]
    order = []
    while ready:
        node = ready.pop()
        order.append(node)
        for child, _ in node.next_functions:
            if child is not None:
                parents[child] -= 1
                if not parents[child]:
                    ready.append(child)
    return order


class _RecordedTruth:
    """What isolation's truth run gives: the calls, the truth role's trace contents, the
    calls rerun for it, and the calls left open (none, unless hooks were skipped)."""

    def __init__(self, calls, tensors, tags, precision, random, rerun, open_calls):
        self.calls, self.tensors, self.tags = calls, tensors, tags
        self.precision, self.random = precision, random
        self.rerun, self.open_calls = rerun, open_calls


def _record_truth(model, inputs, globs, device, mode, seed=0):
    """Runs ``model`` forward and backward once in float64, the truth of isolation: every
    call of the selected modules, and the truth role's tensors for each of them (rerun on
    its own where the run cannot give them)."""
    copied = _module_copy(model, torch.float64, device, mode)
    args = _cast(_as_args(inputs), torch.float64, device)
    run = _TruthRun(copied, globs)
    handles = run.hooks()
    try:
        with tf32_off(), watch_randomness(copied) as random, \
                _precision.float64_truth(copied, mode) as precision:
            _forward_backward(copied, args, seed, into_caches=False,
                              before_backward=run.check_the_graph)
    finally:
        for h in handles:
            h.remove()
    rerun, again_precision = {}, None
    to_rerun = [c for c in run.calls if c.rerun is not None]
    if to_rerun:
        again = _module_copy(model, torch.float64, device, mode)
        with tf32_off(), watch_randomness(again) as again_random, \
                _precision.float64_truth(again, mode) as again_precision:
            rerun = {c: _run_calls(again, [c], torch.float64, device) for c in to_rerun}
        random = _both(random, again_random)
    tensors, tags = run.truth(rerun)
    precision = _precision_of_the_truth(precision, again_precision, run.calls)
    for call in run.calls:  # what holds the run's autograd graph
        call.made, call.output_nodes = [], []
    return _RecordedTruth(run.calls, tensors, tags, precision, random,
                          [c.base for c in to_rerun], run.open_calls())


def _both(random, again):
    """The randomness of two runs, as one trace's metadata records it."""
    return {k: random[k] + [x for x in again[k] if x not in random[k]] for k in random}


def _precision_of_the_truth(run, again, calls):
    """The truth's precision record: the run's for the modules whose calls were all taken
    from it (their backward too, all under "(backward)"), the reruns' for the rest. The
    model's own code outside every selected module computes no isolated tensor."""
    rerun = {c.path for c in calls if c.rerun is not None}
    below = {m: ops for m, ops in run["below_float64"].items() if m and m not in rerun}
    for m, ops in (again or {}).get("below_float64", {}).items():
        below[m] = sorted(set(below.get(m, [])) | set(ops))
    return {**run, "below_float64": below}


def _run_isolated(model, calls, dtype, device, mode):
    """Runs each recorded call on a copy of ``model`` in ``dtype``: {name: tensor}, tags, for
    float64 the truth's precision record (see _precision.py), and the randomness it used."""
    copied = _module_copy(model, dtype, device, mode)
    truth = _precision.float64_truth(copied, mode) if dtype == torch.float64 else None
    with watch_randomness(copied) as random, truth or contextlib.nullcontext() as precision:
        tensors, tags = _run_calls(copied, calls, dtype, device)
    return tensors, tags, precision, random


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


def _isolated_trace(tensors, tags, dtype, precision, random):
    metadata = {"dtype_recipe": str(dtype).replace("torch.", ""), "order": list(tensors),
                "tags": tags, "random": random}
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
    runs = {"truth": _isolated_trace(truth.tensors, truth.tags, torch.float64, truth.precision,
                                     truth.random)}
    with tf32_off():
        for role, model in (("ref", model_ref), ("test", model_test)):
            tensors, tags, _, random = _run_isolated(model, truth.calls, dtype, device,
                                                     float64_truth)
            runs[role] = _isolated_trace(tensors, tags, dtype, None, random)
    # No first divergence here, where no module sees another's output: the core ranks the
    # modules by their own worst tensor instead.
    return _judge(runs["test"], runs["ref"], runs["truth"], module_ranking=True, **judge_options)
