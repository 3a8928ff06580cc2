"""Latency timing: the iteration cap, and the time budget the latency-versus-batch curve uses."""

from __future__ import annotations

import time

from infopt.validators.latency import measure


def test_time_budget_stops_after_the_minimum_runs_once_spent():
    slow = {"slow": lambda feed: time.sleep(0.03)}
    (stats,) = measure(slow, {4: {}}, warmup=0, iterations=50, seconds=0.05, min_iterations=5)
    assert stats.iterations == 5 and stats.batch == 4 and stats.p50_ms >= 30.0


def test_without_budget_or_within_it_every_iteration_runs():
    fast = {"fast": lambda feed: None}
    assert [s.iterations for s in measure(fast, {1: {}, 2: {}}, warmup=1, iterations=7)] == [7, 7]
    assert [s.iterations for s in measure(fast, {1: {}}, warmup=0, iterations=7, seconds=60.0)] == [7]
