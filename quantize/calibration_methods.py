"""The names of the calibration methods (``observers.py`` implements them), declared once; no numpy,
so that ``infopt build --help`` can list them without loading it."""

from __future__ import annotations

from typing import Literal, get_args

CalibrationMethod = Literal["minmax", "percentile", "entropy", "mse"]
"""how activation ranges are calibrated (the ``method`` of an Observer and of the INT8 pass)"""
METHODS: tuple[str, ...] = get_args(CalibrationMethod)
