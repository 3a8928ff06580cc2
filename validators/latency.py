"""Latency: warm up, then time each runner at each batch size, side by side in one run.

The timed runs of each runner are split into ``BLOCKS`` blocks, and the runners take turns block by
block (in mirrored order on alternate rounds, as the gate's ABBA trials do), so a slow spell of the
machine lands on every runner rather than on whichever ran during it. Within a block one runner runs
alone, so neither runtime's idle worker threads (ONNX Runtime spins its pool between runs, torch's
OpenMP pool does too) steal cores from the other's runs for more than a run or two.

The p50 is the median of the blocks' medians: a stall that spans a whole block moves one block, not
the figure. p90/p99 and the mean are over every run (the tail is what they are for). Throughput is
batch / p50, the same statistic as the latency beside it, so a speedup read off either agrees.
``spread`` is how far the block medians lie apart (the most extreme one of each side left out, since
the median already ignores it), relative to the p50; above ``NOISY_SPREAD`` the machine was too noisy
for the figure to be trusted closely, and the build says so.

Timing stops once the figure is known well enough: after ``MIN_BLOCKS`` rounds, a runner whose
median is pinned to within ``tolerance`` of itself (the distribution-free 95% confidence interval
of the median, from the order statistics of all its runs) runs no more blocks at that batch size;
one that is not keeps going, up to ``iterations`` runs. With a time budget (``seconds``, the
recipe's ``latency.seconds``), each block of a slow runner also ends once its share of the budget is
spent, so a model that takes 150 ms a run is timed in about 20 runs rather than 50, and a runner whose
single runs outlast their block's share stops once the whole budget is spent and ``min_iterations``
runs are in (the curve's 3 runs at batch 64, not one per block). Warm-up stops
after ``warmup`` runs or ``WARMUP_S`` seconds, whichever comes first (at least ``MIN_WARMUP`` runs).

A runner on a CUDA device is timed with CUDA events around each run, after a synchronize, so the
figure is the GPU's time for the call (copies in and out included), not the host's launch time.
"""

from __future__ import annotations

import time
from typing import Callable

import numpy as np

from infopt.core.manifest_schema import LatencyRow

BLOCKS = 5
"""blocks each runner's timed runs are split into (fewer when there are fewer runs)"""
NOISY_SPREAD = 0.25
"""block medians further apart than this fraction of the p50 mean the machine was noisy"""
MIN_BLOCKS = 3
"""rounds every runner runs before its timing may stop early"""
TOLERANCE = 0.02
"""stop once the median's 95% confidence interval lies within this fraction of it on either side"""
WARMUP_S = 0.5
MIN_WARMUP = 2


class LatencyStats(LatencyRow):
    """One runner's timing at one batch size: the manifest's latency row (``core/manifest_schema.py``
    declares its fields), and whether the machine was too noisy to trust it closely."""

    @property
    def noisy(self) -> bool:
        return self.spread > NOISY_SPREAD

    def to_json(self) -> dict:
        return self.model_dump()


def summarize(runner: str, batch: int, seconds: list[float], block_medians: list[float] | None = None) -> LatencyStats:
    """Statistics of one runner's runs at one batch size (``block_medians`` in seconds, one per block)."""
    ms = np.asarray(seconds) * 1e3
    blocks = np.asarray(block_medians) * 1e3 if block_medians else np.asarray([np.median(ms)])
    p50 = float(np.median(blocks))
    p90, p99 = (max(p50, float(v)) for v in np.percentile(ms, [90, 99]))
    kept = np.sort(blocks)[1:-1] if len(blocks) >= 4 else blocks  # one odd block is what the median is for
    spread = float((kept.max() - kept.min()) / p50) if p50 > 0 else 0.0
    return LatencyStats(runner=runner, batch=batch, p50_ms=p50, p90_ms=p90, p99_ms=max(p90, p99), mean_ms=float(ms.mean()),
                        throughput=batch / (p50 / 1e3) if p50 > 0 else 0.0, iterations=len(ms), blocks=len(blocks),
                        spread=spread)


def host_timer(fn: Callable[[dict], object], feed: dict) -> float:
    """Seconds one call takes on the host clock."""
    start = time.perf_counter()
    fn(feed)
    return time.perf_counter() - start


def cuda_timer(fn: Callable[[dict], object], feed: dict) -> float:
    """Seconds one call takes on the GPU: CUDA events around it, after a synchronize."""
    import torch

    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    fn(feed)
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1e3


def _block_sizes(iterations: int, blocks: int) -> list[int]:
    count = max(1, min(blocks, iterations))
    return [iterations // count + (1 if k < iterations % count else 0) for k in range(count)]


def median_pinned(seconds: list[float], tolerance: float, z: float = 1.96) -> bool:
    """Whether the distribution-free confidence interval of the median (order statistics
    ``n/2 -+ z*sqrt(n)/2``) lies within ``tolerance`` of the median on both sides."""
    n = len(seconds)
    if n < 5 or tolerance <= 0:
        return False
    ordered = sorted(seconds)
    half = z * n**0.5 / 2
    lo, hi = ordered[max(0, int(n / 2 - half))], ordered[min(n - 1, int(np.ceil(n / 2 + half)))]
    middle = float(np.median(ordered))
    return middle > 0 and (middle - lo) <= tolerance * middle and (hi - middle) <= tolerance * middle


def _warm(fn: Callable[[dict], object], feed: dict, runs: int, least: int = MIN_WARMUP, seconds: float = WARMUP_S) -> None:
    start = time.perf_counter()
    for k in range(runs):
        if k >= least and time.perf_counter() - start >= seconds:
            return
        fn(feed)


def measure(runners: dict[str, Callable[[dict], object]], feeds: dict[int, dict[str, np.ndarray]],
            warmup: int = 10, iterations: int = 50, devices: dict[str, str] | None = None,
            seconds: float | None = None, min_iterations: int = 5, *, blocks: int = BLOCKS,
            tolerance: float = TOLERANCE, min_warmup: int = MIN_WARMUP, warmup_s: float = WARMUP_S,
            timer: Callable[[Callable[[dict], object], dict], float] | None = None) -> list[LatencyStats]:
    """Time every runner (name -> callable taking a feed) at every batch size in ``feeds``, in
    interleaved blocks (see the module doc); ``devices`` names the runners that run on ``cuda``
    (timed with CUDA events; the rest on the host clock), ``timer(fn, feed)`` replaces both. A
    runner whose median is pinned within ``tolerance`` after ``MIN_BLOCKS`` blocks stops there (0:
    never early). With ``seconds``, a runner's timing at one batch size also stops once that long
    is spent and at least ``min_iterations`` runs are in (``LatencyStats.iterations`` says how many).
    Warm-up stops after ``warmup`` runs or ``warmup_s`` seconds, at least ``min_warmup`` runs."""
    names = list(runners)
    sizes = _block_sizes(iterations, blocks)
    floor = -(-min_iterations // len(sizes))  # runs every block keeps under a time budget
    results = []
    for batch, feed in feeds.items():
        for name in names:
            _warm(runners[name], feed, warmup, min_warmup, warmup_s)
        times: dict[str, list[float]] = {n: [] for n in names}
        medians: dict[str, list[float]] = {n: [] for n in names}
        spent: dict[str, float] = {n: 0.0 for n in names}
        active = list(names)
        for k, size in enumerate(sizes):
            for name in active if k % 2 == 0 else list(reversed(active)):
                clock = timer or (cuda_timer if (devices or {}).get(name) == "cuda" else host_timer)
                block: list[float] = []
                start = time.perf_counter()
                while len(block) < size:
                    block.append(clock(runners[name], feed))
                    if seconds is not None and len(block) >= floor and time.perf_counter() - start >= seconds / len(sizes):
                        break
                spent[name] += time.perf_counter() - start
                times[name] += block
                medians[name].append(float(np.median(block)))
            # a runner slower than its blocks' share: done once the budget is spent and the least runs are in
            active = [n for n in active if seconds is None or spent[n] < seconds or len(times[n]) < min_iterations]
            if k + 1 >= MIN_BLOCKS:
                active = [n for n in active if not median_pinned(times[n], tolerance)]
            if not active:
                break
        results += [summarize(name, batch, times[name], medians[name]) for name in names]
    return results
