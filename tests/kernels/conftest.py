"""Kernel tests run the Triton launchers on CUDA when there is a GPU, else in Triton's CPU
interpreter: ``TRITON_INTERPRET=1`` must be set before triton is first imported, which this
module does when pytest collects the folder."""

from __future__ import annotations

import os
import sys

import pytest
import torch

if not torch.cuda.is_available():
    if "triton" in sys.modules and os.environ.get("TRITON_INTERPRET", "").lower() not in ("1", "true", "yes", "on"):
        raise RuntimeError("triton was imported before tests/kernels could set TRITON_INTERPRET=1; "
                           "run with TRITON_INTERPRET=1 in the environment")
    os.environ["TRITON_INTERPRET"] = "1"

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture
def device() -> str:
    """Where the launchers run: the GPU, or the CPU under the interpreter (checked here)."""
    pytest.importorskip("triton", reason="the Triton launchers need triton")
    if DEVICE == "cpu":
        from infopt.kernels import norms, w4a16

        assert w4a16.interpreting() and norms.interpreting(), "the kernels were not built for the interpreter"
    return DEVICE
