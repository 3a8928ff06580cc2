"""Kernel tests run the Triton launchers on CUDA when there is a GPU, else in Triton's CPU
interpreter: ``TRITON_INTERPRET=1`` must be set before triton is first imported, which
``tests/conftest.py`` does; the ``device`` fixture checks that the kernels were built for it."""

from __future__ import annotations

import pytest
import torch

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture
def device() -> str:
    """Where the launchers run: the GPU, or the CPU under the interpreter (checked here)."""
    pytest.importorskip("triton", reason="the Triton launchers need triton")
    if DEVICE == "cpu":
        from infopt.kernels import norms, w4a16

        assert w4a16.interpreting() and norms.interpreting(), "the kernels were not built for the interpreter"
    return DEVICE
