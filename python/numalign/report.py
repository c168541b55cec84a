"""report.py: a judgement's result; the text is the CLI's report (the same C++ code)."""
from __future__ import annotations

import json


class Report:
    """``aligned``, per-tensor results with every metric (``tensors``), ``warnings``,
    ``to_json()``, ``to_junit()``; ``str()`` is the text report, failures first."""

    def __init__(self, core):
        self._core = core
        self._parsed = None

    @property
    def _data(self) -> dict:
        # Parsed on first use: a pass/fail check on a large model needs none of it.
        if self._parsed is None:
            self._parsed = json.loads(self._core.json())
        return self._parsed

    @property
    def aligned(self) -> bool:
        return self._core.aligned

    @property
    def exit_code(self) -> int:
        return self._core.exit_code

    @property
    def summary(self) -> dict:
        return self._data["summary"]

    @property
    def warnings(self) -> list:
        return list(self._data["warnings"])

    @property
    def could_not_judge(self) -> list:
        """Why the run as a whole cannot be judged (e.g. nothing was judged): when not
        empty, the report is not aligned whatever its tensors say (exit code 2)."""
        return list(self._data["could_not_judge"])

    @property
    def first_divergence(self):
        """``{"forward": point, "backward": point}`` for traces that record modules (from
        ``capture.trace_model``), each point ``None`` or ``{"tensor", "module",
        "inputs_aligned", "failing_inputs"}`` (and ``"op": "aten.mm"`` for an op's result,
        from ``capture.trace_ops``): the first failing tensor in that direction and whether
        its inputs passed (True: its module, or op, is the culprit; False: inherited; None:
        not recorded). ``None`` when the traces record no modules."""
        return self._data.get("first_divergence")

    @property
    def tensors(self) -> list:
        """One dict per tensor (JSON field names), failures first."""
        return self._data["tensors"]

    @property
    def ranking(self):
        """For ``capture.isolate``: ``[{"module", "tensor", "ratio", "limit", "aligned"}]``,
        modules by their own worst ratio / limit, worst first; None otherwise."""
        return self._data.get("ranking")

    @property
    def first_differing(self):
        """For ``training.check_resume``: the first tensor, in state order, that differs."""
        return self._data.get("first_failing")

    def by_tag(self, *keys) -> dict:
        """Verdicts summarised by the reference trace's tags: ``{(value, ...): {"tensors",
        "passed", "failed", "errors", "max_ratio"}}`` for the tag ``keys`` (e.g. ``"path",
        "m"``), in execution order; untagged tensors under ``("",) * n``."""
        return {tuple(values): {"tensors": n, "passed": passed, "failed": failed,
                                "errors": errors, "max_ratio": max_ratio}
                for values, n, passed, failed, errors, max_ratio in self._core.by_tag(list(keys))}

    def __getitem__(self, name: str) -> dict:
        for t in self.tensors:
            if t["name"] == name:
                return t
        raise KeyError(name)

    def __bool__(self) -> bool:
        return self.aligned

    def to_json(self) -> str:
        return self._core.json()

    def to_junit(self) -> str:
        return self._core.junit()

    def to_html(self) -> str:
        """One self-contained page (the CLI's ``--format html``): verdict, first divergence,
        charts of ratio per tensor, ULP distances and error against magnitude, the table."""
        return self._core.html()

    def text(self, verbose: bool = False) -> str:
        return self._core.text(verbose)

    def __str__(self) -> str:
        return self._core.text(False)

    def __repr__(self) -> str:
        s = self.summary
        return f"<numalign.Report aligned={self.aligned} tensors={s['tensors']} failed={s['failed']} errors={s['errors']}>"
