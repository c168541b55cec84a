"""report.py: a judgement's result; the text is the CLI's report (the same C++ code)."""
from __future__ import annotations

import json


class Report:
    """``aligned``, per-tensor results with every metric (``tensors``), ``warnings``,
    ``to_json()``, ``to_junit()``; ``str()`` is the text report, failures first."""

    def __init__(self, core):
        self._core = core
        self._parsed = None
        # Set by capture.isolate(): modules by their own worst ratio / limit, worst first.
        self.ranking = None
        # The reference trace's tags per tensor (set by judge()), for by_tag().
        self.tags = {}
        # Set by training.check_resume(): the first tensor, in state order, that differs.
        self.first_differing = None

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
    def first_divergence(self):
        """``{"forward": point, "backward": point}`` for traces that record modules (from
        ``capture.trace_model``), each point ``None`` or ``{"tensor", "module",
        "inputs_aligned", "failing_inputs"}``: the first failing tensor in that direction
        and whether its inputs passed (True: its module is the culprit; False: inherited;
        None: not recorded). ``None`` when the traces record no modules."""
        return self._data.get("first_divergence")

    @property
    def tensors(self) -> list:
        """One dict per tensor (JSON field names), failures first."""
        return self._data["tensors"]

    def by_tag(self, *keys) -> dict:
        """Verdicts summarised by the reference trace's tags: ``{(value, ...): {"tensors",
        "passed", "failed", "errors", "max_ratio"}}`` for the tag ``keys`` (e.g. ``"path",
        "m"``), in the order the tags first appear; untagged tensors under ``("",) * n``."""
        results = {t["name"]: t for t in self.tensors}
        groups = {}
        names = [n for n in self.tags if n in results] + [n for n in results if n not in self.tags]
        for name in names:
            t, tag = results[name], self.tags.get(name, {})
            g = groups.setdefault(tuple(str(tag.get(k, "")) for k in keys),
                                  {"tensors": 0, "passed": 0, "failed": 0, "errors": 0,
                                   "max_ratio": None})
            g["tensors"] += 1
            g[{"pass": "passed", "fail": "failed"}.get(t["verdict"], "errors")] += 1
            if t.get("ratio") is not None:
                g["max_ratio"] = t["ratio"] if g["max_ratio"] is None else max(g["max_ratio"], t["ratio"])
        return groups

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
        head = f"first tensor that differs: {self.first_differing}\n\n" if self.first_differing else ""
        return head + self._ranking_text() + self._core.text(False)

    def _ranking_text(self) -> str:
        if not self.ranking:
            return ""
        lines = ["modules in isolation (each on the truth's inputs), worst first:"]
        for i, e in enumerate(self.ranking, 1):
            ratio = "-" if e["ratio"] is None else f"{e['ratio']:.4g}"
            limit = "-" if e["limit"] is None else f"{e['limit']:.4g}"
            verdict = "pass" if e["aligned"] else "FAIL"
            lines.append(f"  {i:>3}. {verdict:<4}  {e['module'] or '(model)'}  ratio {ratio} / "
                         f"limit {limit}  ({e['tensor']})")
        return "\n".join(lines) + "\n\n"

    def __repr__(self) -> str:
        s = self.summary
        return f"<numalign.Report aligned={self.aligned} tensors={s['tensors']} failed={s['failed']} errors={s['errors']}>"
