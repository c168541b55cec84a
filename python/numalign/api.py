"""api.py: judge() and assert_aligned() on tensors, arrays, nested outputs, traces or paths.
Python only hands the runs and the user's arguments to the core, which pairs, resolves the
options (defaults < policy < arguments given), judges and reports, as the CLI does."""
from __future__ import annotations

import contextlib
import gc
import json
import os

from . import _core
from ._tensors import check_text
from .report import Report
from .trace import Trace, as_core_trace

_recorders = []  # callbacks of the pytest plugin: every report made in the session


def _add_rules(args, rules):
    """rules: a spec for everything ("ulp:1"), a {glob: spec} dict, or ["glob=spec", ...];
    a dict value may be (spec, reason) to explain a loosening."""
    if rules is None:
        return
    if isinstance(rules, str):
        rules = [rules]
    if isinstance(rules, dict):
        for glob, spec in rules.items():
            spec, reason = spec if isinstance(spec, tuple) else (spec, "")
            for text, what in ((glob, "rules: the glob"), (spec, "rules: the rule"),
                               (reason, "rules: the reason")):
                check_text(text, what)
            args.add_override(glob, spec, reason)
    else:
        for text in rules:
            check_text(text, "rules:")
            args.add_rule(text)


def _options(*, tol=None, rules=None, policy=None, equal_nan=None, check_bias=None,
               larger_multiplier_for_small=None, force_max_multiplier=None, threads=None,
               magnitude_profile=None, only=None, shared_randomness=None, map=None,
               module_ranking=False, first_failing=False):
    """The core's options from the arguments: None means "not given", so a policy's value
    stands. Resolved before any tensor is handed over, so a bad option raises first."""
    a = _core.JudgeArguments()
    a.tol, a.equal_nan, a.check_bias = tol, equal_nan, check_bias
    a.larger_multiplier_for_small = larger_multiplier_for_small
    a.force_max_multiplier = force_max_multiplier
    a.threads, a.magnitude_profile = threads, magnitude_profile
    check_text(shared_randomness, "shared_randomness:")
    a.shared_randomness = shared_randomness
    if policy is not None:
        if isinstance(policy, dict):
            a.policy_json = json.dumps(policy)
        else:
            a.policy_path = os.fspath(policy)
    if map is not None:  # the map file's JSON (a dict), or its path
        if isinstance(map, dict):
            a.map_json = json.dumps(map)
        else:
            a.map_path = os.fspath(map)
    _add_rules(a, rules)
    if only is not None:
        globs = [only] if isinstance(only, str) else list(only)
        for glob in globs:
            check_text(glob, "only: the glob")
        a.only = globs
    a.module_ranking, a.first_failing = module_ranking, first_failing
    return _core.resolve_options(a)


class Ranks:
    """A test run saved as one trace per tensor-parallel rank, rank 0 first (paths, Traces or
    tensors): ``judge`` pairs the ranks' pieces with the single-process ref as ``map``'s
    ``sharded_dim`` / ``replicated`` entries say (``numalign.distributed.ranks`` builds one
    from the path given to ``distributed.save``)."""

    def __init__(self, runs):
        self.runs = list(runs)
        if not self.runs:
            raise ValueError("Ranks needs the run of at least one rank")

    def __repr__(self):
        return f"Ranks({len(self.runs)} ranks)"


def _runs(test, ref, truth):
    return (as_core_trace(test), as_core_trace(ref),
            None if truth is None else as_core_trace(truth))


def _judge_runs(test, ref, truth, options):
    """The core's judgement of the runs: one test run, or its ranks."""
    if isinstance(test, Ranks):
        return _core.judge_ranks([as_core_trace(r) for r in test.runs], as_core_trace(ref),
                                 None if truth is None else as_core_trace(truth), options)
    return _core.judge(*_runs(test, ref, truth), options)


def judge(test, ref, truth=None, *, tol=None, rules=None, policy=None, equal_nan=None,
          larger_multiplier_for_small=None, force_max_multiplier=None, check_bias=None,
          threads=None, magnitude_profile=None, only=None, shared_randomness=None,
          map=None) -> Report:
    """Judges every tensor of ``ref`` (or those matching the globs ``only``) against the
    same-named tensor of ``test``, measured against the float64 ``truth``. Each may be a
    tensor, an array, a nested structure of them (flattened to dotted names: ``logits``,
    ``past.0.key``), a Trace, or a path. Options left None take the policy's value, else
    the default (rule measured, tol 1e-4, flags off), as the CLI's options do.
    The default rule and ``same`` need the truth; without one, judge with a rule that needs
    none (``exact``, ``ulp:K``, ``abs:X``, ``allclose``), else floating tensors cannot be
    judged.
    ``magnitude_profile=True`` also bins each tensor's error by the magnitude of the truth
    during the pass, for the chart of ``Report.to_html()``. Runs that captured random draws
    (dropout in training mode, the RNG) cannot be judged unless ``shared_randomness`` gives
    the written reason their draws are the same. ``map`` pairs tensors whose names or
    layouts differ between the runs (another implementation: fused projections, other module
    names): a dict in the map file's format, or the path of one (README, "Two
    implementations")."""
    return _judge(test, ref, truth, tol=tol, rules=rules, policy=policy, equal_nan=equal_nan,
                  larger_multiplier_for_small=larger_multiplier_for_small,
                  force_max_multiplier=force_max_multiplier, check_bias=check_bias,
                  threads=threads, magnitude_profile=magnitude_profile, only=only,
                  shared_randomness=shared_randomness, map=map)


@contextlib.contextmanager
def _collector_paused():
    """Python's cyclic garbage collector held off while runs are handed to the core: a run of
    thousands of tensors makes tens of thousands of small tuples, and the collections they
    set off scan every object of the process (a model's too), about half the time of judging
    10,000 small tensors. What is made here forms no cycle, so nothing waits to be freed."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _judge(test, ref, truth=None, **arguments) -> Report:
    """judge() with the report sections of the helpers that made the runs (isolate,
    check_resume)."""
    options = _options(**arguments)
    with _collector_paused():
        report = Report(_judge_runs(test, ref, truth, options))
    if _recorders:
        read = _files_read(test, ref, truth)
        for record in _recorders:
            record(report, read)
    return report


def _files_read(*runs) -> list:
    """The trace files the runs were read from (paths, or Traces loaded from one)."""
    files = []
    for run in runs:
        for one in (run.runs if isinstance(run, Ranks) else [run]):
            if isinstance(one, (str, bytes, os.PathLike)):
                files.append(os.fspath(one))
            elif isinstance(one, Trace) and one._file is not None:
                files.append(one._file.path)
    return files


def names(run) -> str:
    """The run's tensor names grouped by module, in execution order, with each one's kind,
    dtype and shape, as ``numalign names`` prints them: what to read before writing a map
    between two implementations. ``run``: a path, Trace, or tensors."""
    return _core.render_names(as_core_trace(run))


def assert_aligned(test, ref, truth=None, **options) -> Report:
    """judge(), raising AssertionError with the report (failures first) when not aligned."""
    report = judge(test, ref, truth, **options)
    if not report.aligned:
        worst = report.summary.get("worst")
        why = report.could_not_judge
        head = (f"could not judge: {'; '.join(why)}" if why
                else f"not aligned: {worst}" if worst else "not aligned")
        raise AssertionError(f"{head}\n{report}")
    return report


def sensitivity(test, ref, truth=None, *, terms=256, **options) -> dict:
    """Plants known bugs in a copy of ``test`` (one reduction term of K = ``terms`` dropped,
    2 ULP away from zero everywhere, one NaN, truncation toward zero, 2 ULP on 1% of the
    elements) and judges each with the same options as ``judge()``: ``{"settings",
    "bugs": [{"bug", "applicable", "caught", "failing", "planted", "worst"}]}``, the run as
    it is first (rows that cannot tell also carry ``"why_not"``). Caught: a tensor the bug was
    planted in passed as it was and fails with it. A rule that misses a planted bug cannot
    fail on that bug either."""
    resolved = _options(**options)
    return json.loads(_core.sensitivity(*_runs(test, ref, truth), resolved, terms))


__all__ = ["judge", "assert_aligned", "sensitivity", "Trace", "Ranks"]
