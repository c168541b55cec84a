"""pytest_plugin.py: ``--numalign-report=PATH`` writes every judgement of the session as JSON
(PATH) and JUnit XML (PATH with .xml), atomically, when the session ends."""
from __future__ import annotations

import json
import os

from . import _core, api

_state = {"reports": [], "current": None}


def pytest_addoption(parser):
    parser.addoption("--numalign-report", default=None, metavar="PATH",
                     help="write every numalign judgement of the session to PATH (JSON) and PATH.xml")


def pytest_configure(config):
    if config.getoption("--numalign-report"):
        api._recorders.append(_record)


def pytest_runtest_setup(item):
    _state["current"] = item.nodeid


def _record(report):
    _state["reports"].append((_state["current"], report))


def _write_atomic(path, text):
    """The core's writer, as the CLI's -o: links followed, mode kept, devices written through."""
    _core.write_file(os.fspath(path), text)


def pytest_sessionfinish(session):
    path = session.config.getoption("--numalign-report")
    if not path:
        return
    judgements = [{"test": nodeid, "report": json.loads(r.to_json())} for nodeid, r in _state["reports"]]
    _write_atomic(path, json.dumps({"judgements": judgements}, indent=1) + "\n")
    suites = [(nodeid or "numalign", r._core) for nodeid, r in _state["reports"]]
    _write_atomic(os.path.splitext(path)[0] + ".xml", _core.render_junit_suites(suites))
    if _record in api._recorders:
        api._recorders.remove(_record)
