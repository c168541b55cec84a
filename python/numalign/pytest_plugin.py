"""pytest_plugin.py: ``--numalign-report=PATH`` writes every judgement of the session as JSON
(PATH) and JUnit XML (PATH with .xml), atomically, when the session ends; never over a trace
the session judged, nor the XML over the JSON."""
from __future__ import annotations

import json
import os

import pytest

from . import _core, api

_state = {"reports": [], "current": None, "read": set()}


def pytest_addoption(parser):
    parser.addoption("--numalign-report", default=None, metavar="PATH",
                     help="write every numalign judgement of the session to PATH (JSON) and PATH.xml")


def _junit_path(path):
    return os.path.splitext(path)[0] + ".xml"


def pytest_configure(config):
    path = config.getoption("--numalign-report")
    if not path:
        return
    if os.path.abspath(_junit_path(path)) == os.path.abspath(path):
        raise pytest.UsageError(
            f"--numalign-report={path}: PATH is the JSON report, and the JUnit one is written "
            f"beside it with .xml, which would replace it: give {os.path.splitext(path)[0]}.json")
    api._recorders.append(_record)


def pytest_runtest_setup(item):
    _state["current"] = item.nodeid


def _record(report, files_read=()):
    _state["reports"].append((_state["current"], report))
    _state["read"].update(files_read)


def _write_atomic(path, text):
    """The core's writer, as the CLI's -o: links followed, mode kept, devices written through,
    and never over a trace file the session's judgements read."""
    _core.write_file(os.fspath(path), text, sorted(_state["read"]))


def pytest_sessionfinish(session):
    path = session.config.getoption("--numalign-report")
    if not path:
        return
    judgements = [{"test": nodeid, "report": json.loads(r.to_json())} for nodeid, r in _state["reports"]]
    suites = [(nodeid or "numalign", r._core) for nodeid, r in _state["reports"]]
    if _record in api._recorders:
        api._recorders.remove(_record)
    try:
        _write_atomic(path, json.dumps({"judgements": judgements}, indent=1) + "\n")
        _write_atomic(_junit_path(path), _core.render_junit_suites(suites))
    except _core.NumalignError as e:  # the session's verdict stands; the report is not written
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        message = f"numalign: --numalign-report not written: {e}"
        if reporter:
            reporter.write_line(message, red=True)
        else:
            print(message)
        session.exitstatus = pytest.ExitCode.USAGE_ERROR
