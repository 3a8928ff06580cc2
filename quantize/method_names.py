"""The names of the quantization methods, each list declared once: calibration methods (their range rules
are in ``observers.py``) and INT4 methods (their config classes in ``int4_config.py``, their handlers beside
their math). No numpy and no pydantic here, so that ``infopt build --help`` lists them without loading either."""

from __future__ import annotations

from typing import Literal, get_args

CalibrationMethod = Literal["minmax", "percentile", "entropy", "mse"]
"""how activation ranges are calibrated (the ``method`` of an Observer and of the INT8 pass)"""
CALIBRATION_METHODS: tuple[str, ...] = get_args(CalibrationMethod)

Int4MethodName = Literal["rtn", "gptq", "awq"]
"""the INT4 methods: the names in ``int4_config.METHOD_CONFIGS`` (a test keeps them equal)"""
