"""numalign: is an implementation numerically aligned with its reference?

The allowance is measured against a float64 truth (PyTorch ``same()``'s rule), not hand-picked.
"""
from ._core import NumalignError, __version__
from .api import Ranks, assert_aligned, judge, sensitivity
from .report import Report
from .trace import Trace

__all__ = ["judge", "assert_aligned", "sensitivity", "Report", "Trace", "Ranks", "NumalignError", "__version__"]
