"""The side-by-side latency ratio: its confidence bounds, and the trial schedule, driven by a scripted timer."""

from __future__ import annotations

import math

import pytest

from infopt.validators.side_by_side import MIN_BLOCK_S, compare, median_interval


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


class ScriptedTimer:
    """Every call of ``fn`` takes ``cost[fn]`` seconds, times a slowdown during the scripted calls."""

    def __init__(self, cost: dict, slow_calls: set[int] = frozenset(), factor: float = 1.0):
        self.cost, self.slow_calls, self.factor, self.calls, self.order = cost, slow_calls, factor, 0, []

    def __call__(self, fn, feed) -> float:
        self.calls += 1
        self.order.append(self.cost[fn][1])
        return self.cost[fn][0] * (self.factor if self.calls in self.slow_calls else 1.0)


def _fns():
    def base(feed):
        return None

    def cand(feed):
        return None

    return base, cand


def test_ratio_and_abba_schedule():
    base, cand = _fns()
    timer = ScriptedTimer({base: (0.02, "b"), cand: (0.05, "c")})
    (estimate,) = compare(cand, base, {4: {}}, trials=5, iterations=3, warmup=0, timer=timer)
    assert estimate.ratio == pytest.approx(2.5) and estimate.lower == pytest.approx(2.5)
    assert estimate.batch == 4 and estimate.trials == 5
    assert estimate.candidate_p50_ms == pytest.approx(50) and estimate.baseline_p50_ms == pytest.approx(20)
    trial_order = "".join(timer.order[6:])  # after the 3+3 calls that size the blocks
    blocks = [trial_order[i:i + estimate.iterations] for i in range(0, len(trial_order), estimate.iterations)]
    assert [b[0] for b in blocks] == list("bccb" * 5)
    assert all(len(set(b)) == 1 for b in blocks)


def test_fast_models_get_blocks_of_at_least_the_minimum_length():
    base, cand = _fns()
    timer = ScriptedTimer({base: (1e-4, "b"), cand: (2e-4, "c")})
    (estimate,) = compare(cand, base, {1: {}}, trials=5, iterations=3, warmup=0, timer=timer)
    assert estimate.iterations == math.ceil(MIN_BLOCK_S / 1e-4)
    assert estimate.ratio == pytest.approx(2.0)


def test_a_slow_spell_in_a_few_trials_does_not_move_the_bounds_past_the_truth():
    """Identical models; every call of trials 2 and 5 (whole ABBA groups) runs 3x slower for one model's
    blocks only. The median and the bounds stay at 1 within the spread of the untouched trials."""
    base, cand = _fns()
    iterations = 1  # blocks of one call each, so call numbers map to blocks
    warmup_and_sizing = 3 + 3
    slow = set()
    for trial in (1, 4):  # 0-based trials whose candidate blocks (2nd and 3rd of the four) are slowed
        first = warmup_and_sizing + trial * 4 + 1
        slow |= {first + 1, first + 2}
    timer = ScriptedTimer({base: (MIN_BLOCK_S, "b"), cand: (MIN_BLOCK_S, "c")}, slow, 3.0)
    (estimate,) = compare(cand, base, {1: {}}, trials=15, iterations=iterations, warmup=0, timer=timer)
    assert estimate.ratio == pytest.approx(1.0)
    assert estimate.lower == pytest.approx(1.0) and estimate.upper == pytest.approx(1.0)


def test_the_ratio_shown_is_the_ratio_of_the_two_times_shown_beside_it():
    """Trials that disagree (the machine's speed changing between them): the median ratio and the two
    times given with it come from the same trial, so the figures never contradict each other."""
    base, cand = _fns()
    iterations, warmup_and_sizing = 1, 3 + 3
    slow = {warmup_and_sizing + trial * 4 + k for trial in (0, 2, 3) for k in (1, 4)}  # baseline blocks of 3 trials
    timer = ScriptedTimer({base: (MIN_BLOCK_S, "b"), cand: (1.5 * MIN_BLOCK_S, "c")}, slow, 4.0)
    (estimate,) = compare(cand, base, {1: {}}, trials=5, iterations=iterations, warmup=0, timer=timer)
    assert estimate.ratio == pytest.approx(estimate.candidate_p50_ms / estimate.baseline_p50_ms)
    assert estimate.lower <= estimate.ratio <= estimate.upper
