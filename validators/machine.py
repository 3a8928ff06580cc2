"""The roof of the machine a build runs on, measured: memory bandwidth and fp32 matmul peak.

The ``cpu`` target is "the machine infopt runs on", so it declares no bandwidth or peak of its own;
a build for it measures both here (about a second) so its report has a roofline. Both are what this
machine reaches, not a datasheet's figure: a copy of ``COPY_MIB`` MiB (bytes read + written over the
best of ``COPY_REPEATS`` runs) and a square fp32 matmul of ``MATMUL_N`` (2n^3 FLOPs over the best of
``MATMUL_REPEATS`` runs) on torch's threads.
"""

from __future__ import annotations

import time

import numpy as np

COPY_MIB = 256
COPY_REPEATS = 3
MATMUL_N = 1024
MATMUL_REPEATS = 5


def _best(fn, repeats: int) -> float:
    fn()  # first touch: page faults and thread start-up are not the machine's speed
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def memory_bandwidth_gbs() -> float:
    source = np.ones(COPY_MIB * 2**20 // 8)
    target = np.empty_like(source)
    seconds = _best(lambda: np.copyto(target, source), COPY_REPEATS)
    return 2 * source.nbytes / seconds / 1e9


def fp32_peak_tflops() -> float:
    import torch  # heavy: loaded only when a build measures its roof

    a, b = torch.randn(MATMUL_N, MATMUL_N), torch.randn(MATMUL_N, MATMUL_N)
    seconds = _best(lambda: torch.mm(a, b), MATMUL_REPEATS)
    return 2 * MATMUL_N**3 / seconds / 1e12


def measured_roof() -> tuple[float, float, str]:
    """(bandwidth GB/s, fp32 peak TFLOP/s, how they were measured)."""
    bandwidth, peak = memory_bandwidth_gbs(), fp32_peak_tflops()
    how = (f"measured on this machine: bandwidth {bandwidth:.1f} GB/s (a {COPY_MIB} MiB copy, best of {COPY_REPEATS}), "
           f"fp32 peak {peak:.3g} TFLOP/s (a {MATMUL_N}x{MATMUL_N} matmul, best of {MATMUL_REPEATS})")
    return bandwidth, peak, how
