"""Observers: turn the values a tensor took during calibration into a quantization range.

Every method sees the tensor twice: a first pass records its min and max, a second fills a
histogram of ``bins`` bins over the symmetric span ``[-a, a]`` (``a`` the larger magnitude), so
the histogram folds exactly onto magnitudes for the symmetric methods.

- ``minmax``: the observed min and max.
- ``percentile``: the values at ``percentile`` and ``100 - percentile`` of the distribution, so
  outliers beyond them saturate.
- ``entropy``: the clipping threshold whose 128-level quantized distribution has the smallest
  KL divergence from the observed one (TensorRT's calibrator); ``bins`` sets the histogram
  resolution and so which thresholds are tried.
- ``mse``: the clipping threshold with the smallest expected squared error (rounding inside the
  range plus clipping outside it) for 8-bit levels.

The ranges always include zero, which quantization must represent exactly.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from infopt.core.errors import UsageError
from infopt.quantize.method_names import CALIBRATION_METHODS as METHODS

LEVELS = 128
"""Quantized levels on one side of zero (int8)."""


@dataclass
class Observer:
    method: str = "minmax"
    percentile: float = 99.99
    bins: int = 2048

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise UsageError(f"unknown calibration method {self.method!r}", fix=f"use one of: {', '.join(METHODS)}")
        if not 50.0 < self.percentile <= 100.0:
            raise UsageError(f"percentile {self.percentile} must be in (50, 100]", fix="for example 99.99")
        if self.bins < 2 * LEVELS or self.bins % 2:
            raise UsageError(f"histogram bins {self.bins} must be an even number of at least {2 * LEVELS}",
                             fix="for example 2048")
        self.lo: float = 0.0
        self.hi: float = 0.0
        self.hist: np.ndarray | None = None

    @property
    def needs_histogram(self) -> bool:
        return self.method != "minmax"

    def observe_range(self, values: np.ndarray) -> None:
        if values.size:
            self.lo = min(self.lo, float(values.min()))
            self.hi = max(self.hi, float(values.max()))

    @property
    def span(self) -> float:
        return max(abs(self.lo), abs(self.hi))

    def observe_histogram(self, values: np.ndarray) -> None:
        span = self.span or 1.0
        counts, _ = np.histogram(values, bins=self.bins, range=(-span, span))
        self.hist = counts.astype(np.float64) if self.hist is None else self.hist + counts

    def range(self) -> tuple[float, float]:
        """The calibrated ``(lo, hi)``, with ``lo <= 0 <= hi``."""
        if self.method == "minmax" or self.hist is None or self.span == 0.0:
            return self.lo, self.hi
        if self.method == "percentile":
            return self._percentile_range()
        magnitudes = self._folded()
        threshold = _kl_threshold(magnitudes) if self.method == "entropy" else _mse_threshold(magnitudes)
        t = threshold * self.span / len(magnitudes)
        return max(self.lo, -t), min(self.hi, t)

    def _percentile_range(self) -> tuple[float, float]:
        cdf = np.cumsum(self.hist) / self.hist.sum()
        edges = np.linspace(-self.span, self.span, self.bins + 1)
        tail = (100.0 - self.percentile) / 100.0
        lo = edges[int(np.searchsorted(cdf, tail, side="right"))]
        hi = edges[min(int(np.searchsorted(cdf, 1.0 - tail, side="left")) + 1, self.bins)]
        return min(0.0, max(self.lo, float(lo))), max(0.0, min(self.hi, float(hi)))

    def _folded(self) -> np.ndarray:
        half = self.bins // 2
        return self.hist[half:] + self.hist[:half][::-1]


def _kl_threshold(hist: np.ndarray) -> int:
    """Bin count ``i`` (threshold at the end of bin ``i``) with the least KL divergence."""
    total = hist.sum()
    best_i, best_kl = len(hist), np.inf
    for i in range(LEVELS, len(hist) + 1, max(1, len(hist) // 256)):
        reference = hist[:i].copy()
        reference[i - 1] += hist[i:].sum()
        nonzero = reference != 0
        quantized = np.zeros(i)
        for chunk in np.array_split(np.arange(i), LEVELS):
            used = nonzero[chunk]
            if used.any():
                quantized[chunk[used]] = hist[chunk].sum() / used.sum()
        p = reference / total
        q = np.maximum(quantized / max(quantized.sum(), 1e-12), 1e-12)
        mask = p > 0
        kl = float(np.sum(p[mask] * np.log(p[mask] / q[mask])))
        if kl < best_kl:
            best_i, best_kl = i, kl
    return best_i


def _mse_threshold(hist: np.ndarray) -> int:
    """Bin count whose clipping threshold gives the least expected squared error."""
    centers = np.arange(len(hist)) + 0.5
    best_i, best_err = len(hist), np.inf
    for i in range(LEVELS // 4, len(hist) + 1, max(1, len(hist) // 256)):
        step = i / (LEVELS - 0.5)
        inside = centers < i
        rounding = hist[inside].sum() * step * step / 12.0
        clipping = float(np.sum(hist[~inside] * (centers[~inside] - i) ** 2))
        if rounding + clipping < best_err:
            best_i, best_err = i, rounding + clipping
    return best_i
