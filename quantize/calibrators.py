"""Calibration methods: how static INT8 turns the values a tensor took during calibration into a range.

Each method is a :class:`Calibrator` registered in :data:`CALIBRATORS`; the INT8 pass's ``method`` option,
``--calib-method`` and its help, and the :class:`~infopt.quantize.observers.Observer` read that one list. An
observer has seen the tensor twice when a rule runs: its min and max (``lo``, ``hi``), and, for a rule that
``needs_histogram``, a histogram of ``bins`` bins over the symmetric span ``[-a, a]`` (``a`` the larger
magnitude), which folds exactly onto magnitudes for the symmetric rules.

- ``minmax``: the observed min and max.
- ``percentile``: the values at ``percentile`` and ``100 - percentile`` of the distribution, so
  outliers beyond them saturate.
- ``entropy``: the clipping threshold whose 128-level quantized distribution has the smallest
  KL divergence from the observed one (TensorRT's calibrator); ``bins`` sets the histogram
  resolution and so which thresholds are tried.
- ``mse``: the clipping threshold with the smallest expected squared error (rounding inside the
  range plus clipping outside it) for 8-bit levels.

A rule returns ``(lo, hi)`` inside the observed range with ``lo <= 0 <= hi`` (quantization must represent
zero exactly). numpy is imported inside the rules, so ``infopt build --help`` lists the names without it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Protocol

from infopt.core.registry import Registry

if TYPE_CHECKING:
    import numpy as np

LEVELS = 128
"""Quantized levels on one side of zero (int8)."""


class Observer(Protocol):
    """What a rule reads of the observer (``quantize/observers.py``) that saw a tensor's calibration values."""

    lo: float
    hi: float
    hist: np.ndarray | None
    """``bins`` counts over ``[-span, span]``, filled when the rule ``needs_histogram``"""
    bins: int
    percentile: float

    @property
    def span(self) -> float: ...


@dataclass(frozen=True)
class Calibrator:
    name: str
    range: Callable[[Observer], tuple[float, float]]
    """the calibrated ``(lo, hi)`` from an observer that has seen every sample"""
    needs_histogram: bool
    """whether the observer fills its histogram (a second pass over the calibration data)"""
    description: str


CALIBRATORS: Registry[Calibrator] = Registry("calibration method", lambda c: c.name)


def register(calibrator: Calibrator) -> Calibrator:
    return CALIBRATORS.register(calibrator)


def names() -> tuple[str, ...]:
    """The registered methods' names, in the order they registered (``minmax`` first: the default)."""
    return tuple(CALIBRATORS.all())


def _minmax(obs: Observer) -> tuple[float, float]:
    return obs.lo, obs.hi


def _percentile(obs: Observer) -> tuple[float, float]:
    import numpy as np

    cdf = np.cumsum(obs.hist) / obs.hist.sum()
    edges = np.linspace(-obs.span, obs.span, obs.bins + 1)
    tail = (100.0 - obs.percentile) / 100.0
    lo = edges[int(np.searchsorted(cdf, tail, side="right"))]
    hi = edges[min(int(np.searchsorted(cdf, 1.0 - tail, side="left")) + 1, obs.bins)]
    return min(0.0, max(obs.lo, float(lo))), max(0.0, min(obs.hi, float(hi)))


def _symmetric(threshold_bins: Callable[[np.ndarray], int]) -> Callable[[Observer], tuple[float, float]]:
    """A rule that clips both sides at one magnitude: ``threshold_bins`` picks it from the folded histogram."""

    def rule(obs: Observer) -> tuple[float, float]:
        half = obs.bins // 2
        magnitudes = obs.hist[half:] + obs.hist[:half][::-1]
        t = threshold_bins(magnitudes) * obs.span / len(magnitudes)
        return max(obs.lo, -t), min(obs.hi, t)

    return rule


def kl_threshold(hist: np.ndarray) -> int:
    """Bin count ``i`` (threshold at the end of bin ``i``) with the least KL divergence."""
    import numpy as np

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


def mse_threshold(hist: np.ndarray) -> int:
    """Bin count whose clipping threshold gives the least expected squared error."""
    import numpy as np

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


register(Calibrator("minmax", _minmax, False, "the observed min and max"))
register(Calibrator("percentile", _percentile, True, "the --calib-percentile and its mirror of the distribution"))
register(Calibrator("entropy", _symmetric(kl_threshold), True, "the least KL divergence (TensorRT's calibrator)"))
register(Calibrator("mse", _symmetric(mse_threshold), True, "the least expected squared error"))
