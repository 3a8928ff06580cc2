"""Latency of a candidate against a baseline, measured side by side so that noise cannot flip a verdict.

At each batch size both models are warmed up, then timed in ``trials`` trials. A trial times four
blocks in the order baseline, candidate, candidate, baseline (ABBA), each block the median of
``iterations`` runs (more for a fast model, so that a block lasts at least ``MIN_BLOCK_S``), and
its ratio is the candidate's two blocks over the baseline's two. A slow spell of the machine lands
on both models within a trial, so it cancels in the ratio, and the mirrored order cancels any
advantage of running first or second (warm caches, another runtime's threads still spinning).

The result is the median of the trial ratios with a distribution-free confidence interval for
that median (order statistics of the trial ratios: the number of ratios below the true median is
Binomial(trials, 1/2) whatever the noise looks like). The gate fails only when the interval's
lower bound is above the limit: the candidate is slower than allowed with the stated confidence.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass
from typing import Callable

import numpy as np

from infopt.validators.latency import cuda_timer, host_timer


@dataclass
class RatioEstimate:
    batch: int
    candidate_p50_ms: float
    """the candidate's time in the median trial (the mean of its two block medians there)"""
    baseline_p50_ms: float
    """the baseline's time in the same trial"""
    ratio: float
    """the median over trials of candidate time / baseline time: exactly candidate_p50_ms / baseline_p50_ms,
    the two figures shown beside it (with an even number of trials, the lower of the middle two)"""
    lower: float
    upper: float
    confidence: float
    """the probability with which each of ``lower`` and ``upper`` bounds the true median ratio"""
    trials: int
    iterations: int

    def to_json(self) -> dict:
        return asdict(self)


def weighted_geomean(values: dict[int, float], weights: dict[int, float] | None = None) -> float | None:
    """exp of the weighted mean log of ``values`` (batch size -> a time ratio or a speedup), each batch size
    weighted by its share of requests (``--batch-mix``); equal weights without ``weights``. None when no value
    has a weight."""
    shares = {b: (weights or {}).get(b, 0.0 if weights else 1.0) for b in values}
    total = sum(shares.values())
    if total <= 0:
        return None
    return math.exp(sum(shares[b] * math.log(v) for b, v in values.items()) / total)


def mix_text(weights: dict[int, float]) -> str:
    """``1: 70%, 32: 30%``: a declared batch mix, as the selection notes name it."""
    return ", ".join(f"{b}: {w:.0%}" for b, w in weights.items())


def median_interval(values: list[float], confidence: float) -> tuple[float, float, float]:
    """(lower, upper, achieved): one-sided confidence bounds for the median of ``values``'
    distribution, each holding with probability ``achieved`` >= ``confidence`` (when there are
    enough values; else the extremes). They are the order statistics x(k) and x(n+1-k) for the
    largest k with P(Binomial(n, 1/2) <= k - 1) <= 1 - confidence."""
    data = sorted(values)
    n = len(data)
    best, tail = 1, 1 / 2 ** n
    below = 0.0
    for k in range(1, n // 2 + 1):
        below += math.comb(n, k - 1) / 2 ** n  # P(Binomial(n, 1/2) <= k - 1)
        if below > 1 - confidence:
            break
        best, tail = k, below
    return data[best - 1], data[n - best], 1 - tail


MIN_BLOCK_S = 0.01
"""A timed block lasts at least this long, so scheduler ticks and timer resolution wash out."""
MAX_ITERATIONS = 1000


def _block(fn: Callable[[dict], object], feed: dict, iterations: int, timer) -> float:
    return statistics.median(timer(fn, feed) for _ in range(iterations))


def block_iterations(fns: tuple[Callable[[dict], object], ...], feed: dict, iterations: int, timer) -> int:
    """``iterations``, raised so that a block of the faster model lasts at least ``MIN_BLOCK_S``."""
    fastest = min(_block(fn, feed, 3, timer) for fn in fns)
    if fastest <= 0:
        return MAX_ITERATIONS
    return int(min(max(iterations, math.ceil(MIN_BLOCK_S / fastest)), MAX_ITERATIONS))


def compare(candidate: Callable[[dict], object], baseline: Callable[[dict], object], feeds: dict[int, dict[str, np.ndarray]],
            *, trials: int = 15, iterations: int = 10, warmup: int = 5, confidence: float = 0.95,
            cuda: bool = False, progress: Callable[[str], None] | None = None,
            timer: Callable[[Callable[[dict], object], dict], float] | None = None) -> list[RatioEstimate]:
    """The candidate/baseline latency ratio at each batch size of ``feeds``, with its bounds.
    ``timer(fn, feed)`` times one call in seconds (default: CUDA events with ``cuda``, else the host clock)."""
    timer = timer or (cuda_timer if cuda else host_timer)
    results = []
    for batch, feed in feeds.items():
        for fn in (baseline, candidate):
            for _ in range(warmup):
                fn(feed)
        runs = block_iterations((baseline, candidate), feed, iterations, timer)
        ratios, cand_ms, base_ms = [], [], []  # per trial
        for trial in range(trials):
            if progress:
                progress(f"latency: batch {batch}, trial {trial + 1}/{trials}")
            b1 = _block(baseline, feed, runs, timer)
            c1 = _block(candidate, feed, runs, timer)
            c2 = _block(candidate, feed, runs, timer)
            b2 = _block(baseline, feed, runs, timer)
            cand_ms.append((c1 + c2) / 2 * 1e3)
            base_ms.append((b1 + b2) / 2 * 1e3)
            ratios.append((c1 + c2) / (b1 + b2))
        lower, upper, coverage = median_interval(ratios, confidence)
        middle = ratios.index(statistics.median_low(ratios))
        results.append(RatioEstimate(batch, cand_ms[middle], base_ms[middle], ratios[middle], lower, upper, coverage,
                                     trials, runs))
    return results
