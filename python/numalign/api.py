"""api.py: judge() and assert_aligned() on tensors, arrays, nested outputs, traces or paths."""
from __future__ import annotations

import gc
import json
import os

from . import _core
from ._tensors import flatten
from .report import Report
from .trace import Trace

_recorders = []  # callbacks of the pytest plugin: every report made in the session


def _as_trace(obj):
    if obj is None:
        return None
    if isinstance(obj, (str, os.PathLike)):
        return Trace.load(obj)
    if isinstance(obj, Trace):
        return obj
    return Trace(flatten(obj))


def _rule_overrides(rules):
    """rules: a spec for everything ("ulp:1"), a {glob: spec} dict, or ["glob=spec", ...];
    a value may be (spec, reason) to explain a loosening."""
    default, overrides = None, []
    if rules is None:
        return default, overrides
    if isinstance(rules, str):
        rules = [rules]
    items = rules.items() if isinstance(rules, dict) else []
    if not isinstance(rules, dict):
        for r in rules:
            glob, eq, spec = r.partition("=")
            if eq:
                items.append((glob, spec))
            else:
                default = r
    for glob, spec in items:
        reason = ""
        if isinstance(spec, tuple):
            spec, reason = spec
        overrides.append((glob, spec, reason))
    return default, overrides


def _items(t, r, u):
    """(name, test, ref, truth) for the core, in ref's execution order first (when
    recorded), then the rest of ref, then test-only names."""
    ordered = [n for n in dict.fromkeys(r.metadata.get("order", [])) if n in r]
    seen = set(ordered)
    names = ordered + [n for n in r if n not in seen] + [n for n in t if n not in r]
    # Tens of thousands of small tuples: a cycle collection in the middle costs more than the
    # loop (they hold no cycles; reference counting frees them).
    collecting = gc.isenabled()
    gc.disable()
    try:
        return [(n,
                 t.core_tensor(n) if n in t else None,
                 r.core_tensor(n) if n in r else None,
                 u.core_tensor(n) if u is not None and n in u else None) for n in names]
    finally:
        if collecting:
            gc.enable()


def _options(*, tol=1e-4, rules=None, policy=None, equal_nan=False,
             larger_multiplier_for_small=False, force_max_multiplier=False, check_bias=False,
             threads=0, magnitude_profile=False):
    """The core's JudgeOptions: a policy (dict or file) first, then the arguments."""
    o = _core.JudgeOptions()
    if policy is not None:
        if isinstance(policy, dict):
            o.load_policy(json.dumps(policy), "policy")
        else:
            with open(os.fspath(policy), encoding="utf-8") as f:
                o.load_policy(f.read(), os.fspath(policy))
    o.tol = tol
    o.equal_nan = o.equal_nan or equal_nan
    o.check_bias = o.check_bias or check_bias
    o.larger_multiplier_for_small = larger_multiplier_for_small
    o.force_max_multiplier = force_max_multiplier
    o.threads = threads
    o.magnitude_profile = magnitude_profile
    default, overrides = _rule_overrides(rules)
    if default is not None:
        o.set_default_rule(default)
    for glob, spec, reason in overrides:
        o.add_override(glob, spec, reason)
    return o


def judge(test, ref, truth=None, *, tol=1e-4, rules=None, policy=None, equal_nan=False,
          larger_multiplier_for_small=False, force_max_multiplier=False, check_bias=False,
          threads=0, magnitude_profile=False) -> Report:
    """Judges every tensor of ``ref`` against the same-named tensor of ``test``, measured
    against the float64 ``truth``. Each may be a tensor, an array, a nested structure of them
    (flattened to dotted names: ``logits``, ``past.0.key``), a Trace, or a path.
    ``magnitude_profile=True`` also bins each tensor's error by the magnitude of the truth
    during the pass, for the chart of ``Report.to_html()``."""
    t, r, u = _as_trace(test), _as_trace(ref), _as_trace(truth)
    items = _items(t, r, u)
    options = _options(tol=tol, rules=rules, policy=policy, equal_nan=equal_nan,
                       larger_multiplier_for_small=larger_multiplier_for_small,
                       force_max_multiplier=force_max_multiplier, check_bias=check_bias,
                       threads=threads, magnitude_profile=magnitude_profile)
    core = _core.judge(items, options,
                       metadata=[json.dumps(x.metadata) if x is not None and x.metadata else None
                                 for x in (t, r, u)])
    report = Report(core)
    report.tags = dict(r.metadata.get("tags") or {})
    for record in _recorders:
        record(report)
    return report


def assert_aligned(test, ref, truth=None, **options) -> Report:
    """judge(), raising AssertionError with the report (failures first) when not aligned."""
    report = judge(test, ref, truth, **options)
    if not report.aligned:
        worst = report.summary.get("worst")
        head = f"not aligned: {worst}" if worst else "not aligned"
        raise AssertionError(f"{head}\n{report}")
    return report


def sensitivity(test, ref, truth=None, *, terms=256, **options) -> dict:
    """Plants known bugs in a copy of ``test`` (one reduction term of K = ``terms`` dropped,
    2 ULP away from zero everywhere, one NaN, truncation toward zero, 2 ULP on 1% of the
    elements) and judges each with the same options as ``judge()``: ``{"settings",
    "bugs": [{"bug", "applicable", "caught", "failing", "planted", "worst"}]}``, the run as
    it is first. A rule that misses a planted bug cannot fail on that bug either."""
    t, r, u = _as_trace(test), _as_trace(ref), _as_trace(truth)
    return json.loads(_core.sensitivity(_items(t, r, u), _options(**options), terms))
