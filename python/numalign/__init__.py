"""numalign: is an implementation numerically aligned with its reference?

The allowance is measured against a float64 truth (the default rule, ``measured``: 3x the
reference's own error over the tensor and at its worst element, and no bias where the
reference has none), not hand-picked; ``rules="same"`` gives PyTorch ``same()``'s verdict.
"""
from ._core import NumalignError, __version__
from .api import Ranks, assert_aligned, judge, names, sensitivity
from .report import Report
from .trace import Trace

__all__ = ["judge", "assert_aligned", "sensitivity", "names", "Report", "Trace", "Ranks", "NumalignError", "__version__"]
