"""Work started in the background gives its result, or its error, to whoever waits for it."""

from __future__ import annotations

import threading

import pytest

from infopt.api.generation_flow import in_background


def test_the_result_and_the_error_reach_the_caller_and_the_thread_does_not_hold_the_process():
    started = threading.Event()

    def work(x):
        started.set()
        return x * 2

    assert in_background(work, 21)() == 42 and started.is_set()

    def broken():
        raise ValueError("bad checkpoint file")

    waiting = in_background(broken)
    with pytest.raises(ValueError, match="bad checkpoint file"):
        waiting()
    release = threading.Event()
    in_background(release.wait)  # never released: a daemon thread, so a failed build exits without waiting
    assert any(t.daemon and t.name == "infopt-wait" for t in threading.enumerate())
    release.set()
