"""Observers: record the values a tensor took during calibration, for a calibration method
(:mod:`infopt.quantize.calibrators`) to turn into a quantization range.

Every tensor is seen twice: a first pass records its min and max, a second (only for a method that
needs it) fills a histogram of ``bins`` bins over the symmetric span ``[-a, a]`` (``a`` the larger
magnitude). The ranges always include zero, which quantization must represent exactly.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from infopt.core.errors import UsageError
from infopt.quantize.calibrators import CALIBRATORS, LEVELS, Calibrator


@dataclass
class Observer:
    method: str = "minmax"
    percentile: float = 99.99
    bins: int = 2048

    def __post_init__(self) -> None:
        self.calibrator: Calibrator = CALIBRATORS.named(self.method)
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
        return self.calibrator.needs_histogram

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
        """The calibrated ``(lo, hi)``, with ``lo <= 0 <= hi``: the method's rule, or the observed min and max
        where a histogram rule has nothing to work on (a constant tensor, or no histogram filled)."""
        if self.span == 0.0 or (self.needs_histogram and self.hist is None):
            return self.lo, self.hi
        lo, hi = self.calibrator.range(self)
        return min(0.0, float(lo)), max(0.0, float(hi))
