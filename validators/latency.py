"""Latency: warm up, then time each runner at each batch size, side by side in one run.

Each runner gets its own warm-up and timed block at each batch size, one runner after the other,
so that neither runtime's idle worker threads (ONNX Runtime spins its pool between runs, torch's
OpenMP pool does too) steal cores from the other's runs. Results are p50/p90/p99 and mean in
milliseconds, and throughput in samples per second.

A runner on a CUDA device is timed with CUDA events around each run, after a synchronize, so the
figure is the GPU's time for the call (copies in and out included), not the host's launch time.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Callable

import numpy as np


@dataclass
class LatencyStats:
    runner: str
    batch: int
    p50_ms: float
    p90_ms: float
    p99_ms: float
    mean_ms: float
    throughput: float
    """samples per second at the mean latency"""
    iterations: int

    def to_json(self) -> dict:
        return asdict(self)


def summarize(runner: str, batch: int, seconds: list[float]) -> LatencyStats:
    ms = np.asarray(seconds) * 1e3
    p50, p90, p99 = np.percentile(ms, [50, 90, 99])
    mean = float(ms.mean())
    return LatencyStats(runner, batch, float(p50), float(p90), float(p99), mean, batch / (mean / 1e3), len(ms))


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


def measure(runners: dict[str, Callable[[dict], object]], feeds: dict[int, dict[str, np.ndarray]],
            warmup: int = 10, iterations: int = 50, devices: dict[str, str] | None = None,
            seconds: float | None = None, min_iterations: int = 5) -> list[LatencyStats]:
    """Time every runner (name -> callable taking a feed) at every batch size in ``feeds``;
    ``devices`` names the runners that run on ``cuda`` (the rest are timed on the host clock).
    With ``seconds``, timing at one batch size stops early once that long is spent and at least
    ``min_iterations`` runs are in (``LatencyStats.iterations`` says how many)."""
    results = []
    for batch, feed in feeds.items():
        for name, fn in runners.items():
            for _ in range(warmup):
                fn(feed)
            timer = cuda_timer if (devices or {}).get(name) == "cuda" else host_timer
            times: list[float] = []
            start = time.perf_counter()
            while len(times) < iterations:
                times.append(timer(fn, feed))
                if seconds is not None and len(times) >= min_iterations and time.perf_counter() - start >= seconds:
                    break
            results.append(summarize(name, batch, times))
    return results
