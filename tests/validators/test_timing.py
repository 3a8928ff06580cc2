"""The one timing protocol (``validators/timing.py``): interleaved blocks and robust statistics (driven by a
scripted timer), the iteration cap, the time budgets, the paired ratios to a baseline with their confidence
bounds, the early stop of a runner that clearly lost, and the choice."""

from __future__ import annotations

import math
import time

import pytest

from infopt.validators.timing import (
    MIN_BLOCK_S,
    MIN_BLOCKS,
    NOISY_SPREAD,
    RatioEstimate,
    choose,
    measure,
    median_interval,
    median_pinned,
    paired,
)


def test_time_budget_stops_after_the_minimum_runs_once_spent():
    slow = {"slow": lambda feed: time.sleep(0.03)}
    (stats,) = measure(slow, {4: {}}, warmup=0, iterations=50, seconds=0.05, min_iterations=5).stats
    assert stats.iterations == 5 and stats.batch == 4 and stats.p50_ms >= 30.0


def test_a_runner_slower_than_its_blocks_share_stops_at_the_least_runs_not_one_run_a_block():
    """The curve's budget (1 s, at least 3 runs): a model whose single run outlasts a block's share is
    timed in 3 runs over 3 blocks, not one run in each of the 5 blocks."""
    calls = []

    def slow(feed):
        calls.append(1)
        time.sleep(0.04)

    (stats,) = measure({"slow": slow}, {64: {}}, warmup=0, iterations=20, seconds=0.1, min_iterations=3,
                       tolerance=0).stats
    assert stats.iterations == 3 == len(calls) and stats.blocks == 3 and stats.p50_ms >= 40.0


def test_the_latency_steps_budget_times_a_slow_runner_in_fewer_runs_and_leaves_a_fast_one_alone():
    """The latency step's seconds per row: each block of a runner ends once its share is spent, and the runner
    stops once all of it is spent and MIN_LATENCY_RUNS runs are in: a 20 ms runner given 50 ms takes one run
    a block for MIN_LATENCY_RUNS blocks (two ABBA trials), not 50 runs; a fast one its 50 runs."""
    from infopt.core.recipe import MIN_LATENCY_RUNS

    calls = {"slow": 0, "fast": 0}

    def slow(feed):
        calls["slow"] += 1
        time.sleep(0.02)

    def fast(feed):
        calls["fast"] += 1

    stats = {s.runner: s for s in measure({"slow": slow, "fast": fast}, {1: {}}, warmup=0, iterations=50, seconds=0.05,
                                          min_iterations=MIN_LATENCY_RUNS, tolerance=0).stats}
    assert stats["slow"].iterations == MIN_LATENCY_RUNS == calls["slow"] == stats["slow"].blocks == 4
    assert stats["slow"].p50_ms >= 20.0
    assert stats["fast"].iterations == 50 == calls["fast"]  # its blocks end at their count long before the budget


def test_a_runner_whose_least_runs_would_take_over_twice_its_budget_keeps_one_abba_trial():
    """BERT-large at batch 8 (2.4 s a run, 2 s a row): with ``least_slow`` a runner whose first block shows its
    MIN_LATENCY_RUNS runs would take over twice its seconds stops after one ABBA trial (two blocks of one run each,
    beside the baseline's two), its ratio from that one trial with 50 % confidence; one that would not, and
    every runner without ``least_slow``, keeps MIN_LATENCY_RUNS."""
    from infopt.core.recipe import MIN_LATENCY_RUNS, MIN_TRIAL_RUNS

    def sleeper(seconds):
        return lambda feed: time.sleep(seconds)

    runners = {"eager": sleeper(0.03), "cand": sleeper(0.03)}
    found = measure(runners, {8: {}}, warmup=0, iterations=50, seconds=0.04, min_iterations=MIN_LATENCY_RUNS,
                    tolerance=0, baseline="eager", least_slow=MIN_TRIAL_RUNS)
    assert {s.runner: s.iterations for s in found.stats} == {"eager": 2, "cand": 2}
    (ratio,) = found.ratios["cand"]
    assert ratio.trials == 1 and ratio.confidence == 0.5
    # 4 runs of 30 ms are 120 ms: not over twice a 70 ms budget, so the least runs stay 4
    found = measure(runners, {8: {}}, warmup=0, iterations=50, seconds=0.07, min_iterations=MIN_LATENCY_RUNS,
                    tolerance=0, baseline="eager", least_slow=MIN_TRIAL_RUNS)
    assert {s.iterations for s in found.stats} == {MIN_LATENCY_RUNS}
    found = measure(runners, {8: {}}, warmup=0, iterations=50, seconds=0.04, min_iterations=MIN_LATENCY_RUNS,
                    tolerance=0, baseline="eager")
    assert {s.iterations for s in found.stats} == {MIN_LATENCY_RUNS}


def test_a_runner_whose_one_trial_would_take_over_twice_its_budget_keeps_one_pair_and_claims_no_confidence():
    """BERT-large's batch-8 row (about 4 s a run, one ABBA trial 16 s of a 13 s timing budget): where even
    MIN_TRIAL_RUNS runs would take over twice a runner's seconds, each runner keeps its first block's one run, the
    baseline's beside it; the ratio is that pair's, with no confidence claimed (the order it ran in is in it)."""
    from infopt.core.recipe import MIN_LATENCY_RUNS, MIN_TRIAL_RUNS

    calls = {"eager": 0, "cand": 0}

    def sleeper(name, seconds):
        return lambda feed: (calls.__setitem__(name, calls[name] + 1), time.sleep(seconds))

    runners = {"eager": sleeper("eager", 0.03), "cand": sleeper("cand", 0.03)}
    found = measure(runners, {8: {}}, warmup=0, iterations=50, seconds=0.02, min_iterations=MIN_LATENCY_RUNS,
                    tolerance=0, baseline="eager", least_slow=MIN_TRIAL_RUNS)
    assert {s.runner: s.iterations for s in found.stats} == {"eager": 1, "cand": 1} and calls == {"eager": 1, "cand": 1}
    (ratio,) = found.ratios["cand"]
    assert ratio.trials == 1 and ratio.confidence == 0.0 and 0.5 < ratio.ratio < 2.0


def test_a_feed_the_runners_just_ran_slowly_is_timed_without_warm_up():
    """``warmed``: the validation ran every runner at this feed's shapes, each run taking at least the warm-up's
    time, so no warm-up run there; a quick one (or a batch not named) is warmed up as ever."""
    runs = {1: 0, 8: 0}

    def counting(feed):
        runs[feed["batch"]] += 1

    feeds = {1: {"batch": 1}, 8: {"batch": 8}}
    measure({"only": counting}, feeds, warmup=3, iterations=2, min_warmup=1, min_block_s=0, warmed={8: 2.4})
    assert runs == {1: 3 + 2, 8: 2}
    runs.update({1: 0, 8: 0})
    measure({"only": counting}, feeds, warmup=3, iterations=2, min_warmup=1, min_block_s=0, warmed={8: 0.001})
    assert runs == {1: 3 + 2, 8: 3 + 2}


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
    assert [s.iterations for s in measure(fast, {1: {}, 2: {}}, warmup=0, iterations=7, tolerance=0).stats] == [7, 7]
    assert [s.iterations for s in measure(fast, {1: {}}, warmup=0, iterations=7, seconds=60.0, tolerance=0).stats] == [7]


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
                                          timer=timer).stats}
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
                                          timer=timer, tolerance=0).stats}
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
                                tolerance=0).stats if s.runner == "eager")
    assert e.p50_ms == pytest.approx(1.0) and e.noisy and e.spread == pytest.approx(15.0) and NOISY_SPREAD < 1


def test_the_build_says_when_the_machine_was_noisy():
    from infopt.api.build_notes import noise_notes
    from infopt.validators.timing import summarize

    quiet = summarize("eager", 1, [0.001] * 10, [0.001, 0.001, 0.001, 0.001, 0.005])
    busy = summarize("fp32-onnxruntime", 1, [0.001] * 10, [0.001, 0.001, 0.0015, 0.002, 0.002])
    assert noise_notes([quiet]) == []
    (note,) = noise_notes([quiet, busy])
    assert note.startswith("WARNING") and "fp32-onnxruntime's 5 block medians at batch 1 lie 67%" in note


def _binomial_cdf(k: int, n: int) -> float:
    return sum(math.comb(n, i) for i in range(k + 1)) / 2 ** n


@pytest.mark.parametrize("n, confidence", [(5, 0.95), (15, 0.95), (15, 0.99), (21, 0.9), (40, 0.95)])
def test_bounds_are_the_order_statistics_the_binomial_gives(n, confidence):
    values = [float(v) for v in range(100, 100 + n)][::-1]  # any order in, sorted inside
    lower, upper, achieved = median_interval(values, confidence)
    k = int(lower) - 100 + 1  # lower is x(k)
    assert upper == 100 + n - k  # x(n + 1 - k)
    assert achieved == pytest.approx(1 - _binomial_cdf(k - 1, n))
    # k is the largest order statistic whose miss probability stays within 1 - confidence
    if _binomial_cdf(0, n) <= 1 - confidence:
        assert _binomial_cdf(k - 1, n) <= 1 - confidence < _binomial_cdf(k, n)
    else:
        assert k == 1  # too few values for that confidence: the extremes, and the coverage they give
        assert achieved < confidence


def test_fifteen_trials_at_95_percent_use_the_4th_and_12th():
    lower, upper, achieved = median_interval([float(i) for i in range(1, 16)], 0.95)
    assert (lower, upper) == (4.0, 12.0)
    assert achieved == pytest.approx(1 - 576 / 32768)


class CostTimer:
    """Every call of a runner takes its scripted cost, times a slowdown during the scripted calls (1-based,
    counting warm-up calls); records who ran, in order."""

    def __init__(self, cost: dict, slow_calls: set[int] = frozenset(), factor: float = 1.0):
        self.cost, self.slow_calls, self.factor, self.calls, self.order = cost, slow_calls, factor, 0, []

    def __call__(self, fn, feed) -> float:
        self.calls += 1
        self.order.append(self.cost[fn][1])
        return self.cost[fn][0] * (self.factor if self.calls in self.slow_calls else 1.0)


def _fns(count: int = 2):
    return [lambda feed: None for _ in range(count)]


def test_the_gates_pair_is_abba_trials_and_its_ratio_is_the_median_trials():
    base, cand = _fns()
    timer = CostTimer({base: (0.02, "b"), cand: (0.05, "c")})
    (estimate,) = paired(cand, base, {4: {}}, trials=5, runs=3, warmup=0, timer=timer)
    assert estimate.ratio == pytest.approx(2.5) and estimate.lower == pytest.approx(2.5)
    assert estimate.batch == 4 and estimate.trials == 5 and estimate.iterations == 3
    assert estimate.candidate_p50_ms == pytest.approx(50) and estimate.baseline_p50_ms == pytest.approx(20)
    blocks = ["".join(timer.order[i:i + 3]) for i in range(0, len(timer.order), 3)]
    assert [b[0] for b in blocks] == list("bccb" * 5) and all(len(set(b)) == 1 for b in blocks)


def test_fast_runners_get_blocks_of_at_least_the_minimum_length_each_at_its_own_pace():
    base, cand = _fns()
    timer = CostTimer({base: (1e-4, "b"), cand: (2e-4, "c")})
    (estimate,) = paired(cand, base, {1: {}}, trials=5, runs=3, warmup=3, timer=timer)
    assert estimate.iterations == math.ceil(MIN_BLOCK_S / 2e-4) and estimate.ratio == pytest.approx(2.0)
    assert timer.order.count("b") == 3 + 10 * math.ceil(MIN_BLOCK_S / 1e-4)  # warm-up, then 10 blocks of 100


def test_a_slow_spell_in_a_few_trials_does_not_move_the_bounds_past_the_truth():
    """Identical runners; every call in the candidate's two blocks of trials 2 and 5 runs 3x slower. The
    median and the bounds stay at 1."""
    base, cand = _fns()
    slow = set()
    for trial in (1, 4):  # 0-based trials; a trial's calls are b c c b, one call a block
        slow |= {trial * 4 + 2, trial * 4 + 3}
    timer = CostTimer({base: (MIN_BLOCK_S, "b"), cand: (MIN_BLOCK_S, "c")}, slow, 3.0)
    (estimate,) = paired(cand, base, {1: {}}, trials=15, runs=1, warmup=0, timer=timer)
    assert "".join(timer.order[4:8]) == "bccb"
    assert estimate.ratio == pytest.approx(1.0)
    assert estimate.lower == pytest.approx(1.0) and estimate.upper == pytest.approx(1.0)


def test_the_ratio_shown_is_the_ratio_of_the_two_times_shown_beside_it():
    """Trials that disagree (the machine's speed changing between them): the median ratio and the two
    times given with it come from the same trial, so the figures never contradict each other."""
    base, cand = _fns()
    slow = {trial * 4 + k for trial in (0, 2, 3) for k in (1, 4)}  # the baseline's blocks of 3 trials
    timer = CostTimer({base: (MIN_BLOCK_S, "b"), cand: (1.5 * MIN_BLOCK_S, "c")}, slow, 4.0)
    (estimate,) = paired(cand, base, {1: {}}, trials=5, runs=1, warmup=0, timer=timer)
    assert estimate.ratio == pytest.approx(estimate.candidate_p50_ms / estimate.baseline_p50_ms)
    assert estimate.lower <= estimate.ratio <= estimate.upper


def test_many_runners_against_one_baseline_each_get_paired_ratios_and_a_clear_loser_stops_after_one_block():
    """The protocol a build's candidates and the INT8 variants share: every runner beside the baseline in the
    same rounds (mirrored each round), each one's ratio from its own ABBA pairs; a runner nearly 4x the
    fastest after its first block is timed no further, and the baseline keeps running while others are."""
    base, fast, medium, slow = _fns(4)
    timer = CostTimer({base: (0.010, "b"), fast: (0.004, "f"), medium: (0.005, "m"), slow: (0.015, "s")})
    found = measure({"fp32": base, "fast": fast, "medium": medium, "slow": slow}, {1: {}, 8: {}}, warmup=0,
                    iterations=6, blocks=6, tolerance=0, baseline="fp32", drop_slower=1.5, timer=timer)
    assert list(found.dropped) == ["slow"] and "3.8x fast's" in found.dropped["slow"]
    assert {(n, r.batch): r.ratio for n, rs in found.ratios.items() for r in rs} == pytest.approx(
        {("fast", 1): 0.4, ("fast", 8): 0.4, ("medium", 1): 0.5, ("medium", 8): 0.5, ("slow", 1): 1.5, ("slow", 8): 1.5})
    assert [r.trials for r in found.ratios["fast"]] == [3, 3] and [r.trials for r in found.ratios["slow"]] == [1, 1]
    assert {s.runner: s.blocks for s in found.stats if s.batch == 1} == {"fp32": 6, "fast": 6, "medium": 6, "slow": 1}
    first_batch = "".join(timer.order[:1 + 3 + 5 * 3])
    assert first_batch == "bfms" + "mfb" + "bfm" + "mfb" + "bfm" + "mfb"  # mirrored rounds, the loser gone after one
    picked = choose(found.ratios, among=["medium", "slow"])
    assert (picked.name, picked.ratio) == ("medium", pytest.approx(0.5))
    assert choose(found.ratios).name == "fast"


def estimate(batch: int, value: float) -> RatioEstimate:
    return RatioEstimate(batch, value, 1.0, value, value - 0.05, value + 0.05, 0.97, 5, 3)


def test_the_choice_weighs_each_batch_size_by_its_share_and_may_keep_the_baseline():
    ratios = {"small": [estimate(1, 0.5), estimate(32, 1.2)], "large": [estimate(1, 0.9), estimate(32, 0.4)]}
    assert choose(ratios, {1: 0.95, 32: 0.05}).name == "small"
    picked = choose(ratios, {1: 0.05, 32: 0.95})
    assert picked.name == "large" and picked.ratio == pytest.approx(math.exp(0.05 * math.log(0.9) + 0.95 * math.log(0.4)))
    slower = {"int8": [estimate(1, 1.3), estimate(8, 1.1)]}
    kept = choose(slower, must_beat_baseline=True)
    assert kept.name is None and kept.best == "int8" and kept.ratio == pytest.approx((1.3 * 1.1) ** 0.5)
    assert choose(slower).name == "int8"
    assert choose({}).name is None and choose({"x": []}).best is None
