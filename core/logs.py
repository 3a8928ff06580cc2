"""Keeping third-party chatter (exporter progress lines, tracing warnings) off the user's terminal."""

from __future__ import annotations

import contextlib
import io
import logging
import warnings
from typing import Iterator

NOISY_LOGGERS = ("torch.onnx", "torch.export", "torch._export", "torch._dynamo", "torch.fx", "onnxscript")


@contextlib.contextmanager
def quiet_third_party() -> Iterator[None]:
    """Silence torch/onnxscript logging below ERROR, Python warnings and stdout and stderr prints inside the
    block; they are still logged at DEBUG level under ``infopt`` when ``--verbose`` is on."""
    loggers = [logging.getLogger(n) for n in NOISY_LOGGERS]
    levels = [lg.level for lg in loggers]
    verbose = logging.getLogger("infopt").isEnabledFor(logging.DEBUG)
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    captured = io.StringIO()
    try:
        # stderr too: torch.export prints the partial graph of a failed capture there (a page of code)
        with warnings.catch_warnings(record=True) as caught, contextlib.redirect_stdout(captured), \
                contextlib.redirect_stderr(captured):
            warnings.simplefilter("always")
            yield
    finally:
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)
    if verbose:
        log = logging.getLogger("infopt.third_party")
        for w in caught:
            log.debug("%s: %s", w.category.__name__, w.message)
        for line in captured.getvalue().splitlines():
            log.debug("%s", line)
