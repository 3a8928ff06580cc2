"""The names of the INT4 methods, declared once (their config classes are in ``int4_config.py``, their handlers
beside their math). No numpy and no pydantic here, so that ``infopt build --help`` lists them without loading
either. Calibration methods are registered with their rules in ``calibrators.py``."""

from __future__ import annotations

from typing import Literal

Int4MethodName = Literal["rtn", "gptq", "awq", "awq-gptq"]
"""the INT4 methods: the names in ``int4_config.METHOD_CONFIGS`` (a test keeps them equal)"""

CheckpointLayout = Literal["auto", "gptq", "awq", "none"]
"""the 4-bit checkpoint layouts for the serving engines (``--int4-checkpoint``; auto: GPTQ, none after AWQ)"""
