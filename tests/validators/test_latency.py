"""Latency timing: interleaved blocks and robust statistics (driven by a scripted timer), the iteration
cap, and the time budget the latency-versus-batch curve uses."""

from __future__ import annotations

import time

import pytest

from infopt.validators.latency import MIN_BLOCKS, NOISY_SPREAD, measure, median_pinned


def test_time_budget_stops_after_the_minimum_runs_once_spent():
    slow = {"slow": lambda feed: time.sleep(0.03)}
    (stats,) = measure(slow, {4: {}}, warmup=0, iterations=50, seconds=0.05, min_iterations=5)
    assert stats.iterations == 5 and stats.batch == 4 and stats.p50_ms >= 30.0


def test_a_runner_slower_than_its_blocks_share_stops_at_the_least_runs_not_one_run_a_block():
    """The curve's budget (1 s, at least 3 runs): a model whose single run outlasts a block's share is
    timed in 3 runs over 3 blocks, not one run in each of the 5 blocks."""
    calls = []

    def slow(feed):
        calls.append(1)
        time.sleep(0.04)

    (stats,) = measure({"slow": slow}, {64: {}}, warmup=0, iterations=20, seconds=0.1, min_iterations=3, tolerance=0)
    assert stats.iterations == 3 == len(calls) and stats.blocks == 3 and stats.p50_ms >= 40.0


def test_the_latency_steps_budget_times_a_slow_runner_in_fewer_runs_and_leaves_a_fast_one_alone():
    """The recipe's ``latency.seconds``: each block of a runner ends once its share of the budget is
    spent (at least MIN_LATENCY_RUNS runs in all), so a 20 ms runner takes 3 runs a block, not 10."""
    from infopt.core.recipe import MIN_LATENCY_RUNS

    calls = {"slow": 0, "fast": 0}

    def slow(feed):
        calls["slow"] += 1
        time.sleep(0.02)

    def fast(feed):
        calls["fast"] += 1

    stats = {s.runner: s for s in measure({"slow": slow, "fast": fast}, {1: {}}, warmup=0, iterations=50, seconds=0.25,
                                          min_iterations=MIN_LATENCY_RUNS, tolerance=0)}
    assert stats["slow"].iterations == MIN_LATENCY_RUNS == calls["slow"] and stats["slow"].blocks == 5
    assert stats["slow"].p50_ms >= 20.0
    assert stats["fast"].iterations == 50 == calls["fast"]  # its blocks end at their count long before the budget


def test_warm_up_stops_at_its_time_and_its_least_runs():
    runs = []

    def slow(feed):
        runs.append(1)
        time.sleep(0.05)

    measure({"slow": slow}, {1: {}}, warmup=3, iterations=1, min_warmup=1, warmup_s=0.01)
    assert len(runs) == 1 + 1  # one warm-up run (past its 0.01 s), one timed run
    runs.clear()
    measure({"slow": slow}, {1: {}}, warmup=3, iterations=1)  # the defaults: at least 2, until 0.5 s
    assert len(runs) == 3 + 1


def test_without_budget_or_within_it_every_iteration_runs():
    fast = {"fast": lambda feed: None}
    assert [s.iterations for s in measure(fast, {1: {}, 2: {}}, warmup=1, iterations=7, tolerance=0)] == [7, 7]
    assert [s.iterations for s in measure(fast, {1: {}}, warmup=0, iterations=7, seconds=60.0, tolerance=0)] == [7]


class ScriptedTimer:
    """Each runner's times from its own list, in turn."""

    def __init__(self, script: dict):
        self.script = {fn: iter(times) for fn, times in script.items()}

    def __call__(self, fn, feed) -> float:
        return next(self.script[fn])


def test_timing_stops_once_the_median_is_pinned_and_not_before():
    """A steady runner stops after MIN_BLOCKS blocks; one whose runs scatter by +-20% runs every block."""
    def steady(feed):
        return None

    def scattered(feed):
        return None

    timer = ScriptedTimer({steady: [0.010] * 50, scattered: [0.008, 0.012] * 25})
    stats = {s.runner: s for s in measure({"steady": steady, "scattered": scattered}, {1: {}}, warmup=0, iterations=50,
                                          timer=timer)}
    assert stats["steady"].iterations == MIN_BLOCKS * 10 and stats["steady"].blocks == MIN_BLOCKS
    assert stats["scattered"].iterations == 50 and stats["scattered"].blocks == 5
    assert stats["steady"].p50_ms == pytest.approx(10.0)


def test_the_median_is_pinned_by_its_confidence_interval():
    assert median_pinned([0.010] * 20 + [0.050] * 3, 0.02)  # a few stalls do not move the median's interval
    assert not median_pinned([0.010, 0.011, 0.012, 0.013] * 5, 0.02)  # +-10% around the median: not within 2%
    assert not median_pinned([0.010] * 4, 0.02)  # too few runs to say


class StallingTimer:
    """eager takes 1 ms and the candidate 0.5 ms, except that the machine stalls (16 ms a call)
    for the whole of eager's first block, as a busy neighbour would; records who ran in what order."""

    def __init__(self, eager, candidate, block: int):
        self.eager, self.candidate, self.block, self.calls, self.order = eager, candidate, block, 0, []

    def __call__(self, fn, feed) -> float:
        self.order.append("e" if fn is self.eager else "c")
        if fn is self.eager:
            self.calls += 1
            return 0.016 if self.calls <= self.block else 0.001
        return 0.0005


def test_a_stall_over_a_whole_block_does_not_make_a_speedup_and_is_reported_as_noise():
    def eager(feed):
        return None

    def candidate(feed):
        return None

    timer = StallingTimer(eager, candidate, block=10)
    stats = {s.runner: s for s in measure({"eager": eager, "infopt": candidate}, {8: {}}, warmup=0, iterations=50,
                                          timer=timer, tolerance=0)}
    e, c = stats["eager"], stats["infopt"]
    assert e.p50_ms == pytest.approx(1.0) and c.p50_ms == pytest.approx(0.5)  # one stalled block of five moves nothing
    assert e.p50_ms / c.p50_ms == pytest.approx(2.0)  # not the 32x a single block would have reported
    assert e.throughput == pytest.approx(8 / 1e-3) and c.throughput == pytest.approx(8 / 0.5e-3)  # batch / p50
    assert e.p99_ms == pytest.approx(16.0) and e.mean_ms > e.p50_ms  # the tail keeps the stall
    assert e.blocks == c.blocks == 5 and e.iterations == c.iterations == 50
    assert not e.noisy and not c.noisy  # one odd block: the median set it aside, nothing to warn of
    runs = "".join(timer.order)
    assert runs == ("e" * 10 + "c" * 10 + "c" * 10 + "e" * 10) * 2 + "e" * 10 + "c" * 10  # turns, mirrored each round

    timer = StallingTimer(eager, candidate, block=20)  # the stall lasts two of eager's blocks: a noisy machine
    e = next(s for s in measure({"eager": eager, "infopt": candidate}, {8: {}}, warmup=0, iterations=50, timer=timer,
                                tolerance=0) if s.runner == "eager")
    assert e.p50_ms == pytest.approx(1.0) and e.noisy and e.spread == pytest.approx(15.0) and NOISY_SPREAD < 1


def test_the_build_says_when_the_machine_was_noisy():
    from infopt.api.build_notes import noise_notes
    from infopt.validators.latency import summarize

    quiet = summarize("eager", 1, [0.001] * 10, [0.001, 0.001, 0.001, 0.001, 0.005])
    busy = summarize("fp32-onnxruntime", 1, [0.001] * 10, [0.001, 0.001, 0.0015, 0.002, 0.002])
    assert noise_notes([quiet]) == []
    (note,) = noise_notes([quiet, busy])
    assert note.startswith("WARNING") and "fp32-onnxruntime's 5 block medians at batch 1 lie 67%" in note
