"""Drift metrics between a reference output and a candidate output.

The validators and the tests use these same functions. Each takes the reference first.

- ``max_abs``  = max |r - c|
- ``mean_abs`` = mean |r - c|
- ``max_rel``  = max |r - c| / max(|r|, 1e-3 * max|r|): relative error, with a floor so that
  near-zero reference values do not dominate
- ``cosine``   = per sample (first axis), r . c / (|r| |c|); reported as min and mean
- ``sqnr_db``  = 10 log10(sum r^2 / sum (r - c)^2), signal-to-quantization-noise ratio
  (as torchao's ``compute_error``); infinite when the outputs are identical
- ``top1``     = share of samples whose argmax over the last axis agrees (classifier outputs)

Values below float32's smallest normal number (about 1.2e-38, the subnormals) count as zero on both
sides: runtimes flush them to zero (ONNX Runtime and oneDNN set flush-to-zero), and an output made
only of them (a randomly initialised head that computes 1e-41) is zero at float32's precision.
"""

from __future__ import annotations

import math

import numpy as np

SUBNORMAL = float(np.finfo(np.float32).tiny)
"""float32's smallest normal magnitude: anything smaller counts as zero"""


def _pair(reference, candidate) -> tuple[np.ndarray, np.ndarray]:
    r = np.asarray(reference, dtype=np.float64)
    c = np.asarray(candidate, dtype=np.float64)
    if r.shape != c.shape:
        raise ValueError(f"shapes differ: reference {r.shape}, candidate {c.shape}")
    return _flushed(r), _flushed(c)


def _flushed(a: np.ndarray) -> np.ndarray:
    """``a`` with its subnormal values as zero (a new array where there are any: ``a`` may be the caller's)."""
    small = (np.abs(a) < SUBNORMAL) & (a != 0)
    return np.where(small, 0.0, a) if small.any() else a


def max_abs(reference, candidate) -> float:
    r, c = _pair(reference, candidate)
    return _max_abs(np.abs(r - c))


def mean_abs(reference, candidate) -> float:
    r, c = _pair(reference, candidate)
    return _mean_abs(np.abs(r - c))


def max_rel(reference, candidate) -> float:
    r, c = _pair(reference, candidate)
    return _max_rel(np.abs(r - c), r)


def cosine_per_sample(reference, candidate) -> np.ndarray:
    return _cosines(*_pair(reference, candidate))


def cosine(reference, candidate) -> float:
    """Mean per-sample cosine similarity."""
    return float(np.mean(cosine_per_sample(reference, candidate)))


def sqnr_db(reference, candidate) -> float:
    r, c = _pair(reference, candidate)
    return _sqnr_db(np.abs(r - c), r)


# Each figure from arrays already in float64 (``error`` is |r - c|), so ``drift`` makes one copy and one
# difference however many figures it reports: an LLM's logits are tens of millions of values.

def _max_abs(error: np.ndarray) -> float:
    return float(np.max(error)) if error.size else 0.0


def _mean_abs(error: np.ndarray) -> float:
    return float(np.mean(error)) if error.size else 0.0


def _max_rel(error: np.ndarray, r: np.ndarray) -> float:
    if not r.size:
        return 0.0
    magnitude = np.abs(r)
    floor = max(1e-3 * float(np.max(magnitude)), 1e-12)
    return float(np.max(error / np.maximum(magnitude, floor)))


def _cosines(r: np.ndarray, c: np.ndarray) -> np.ndarray:
    r = r.reshape(r.shape[0], -1) if r.ndim > 1 else r.reshape(1, -1)
    c = c.reshape(c.shape[0], -1) if c.ndim > 1 else c.reshape(1, -1)
    norms = np.linalg.norm(r, axis=1) * np.linalg.norm(c, axis=1)
    dots = np.sum(r * c, axis=1)
    same = np.all(r == c, axis=1)
    return np.where(same, 1.0, np.where(norms > 0, dots / np.where(norms > 0, norms, 1.0), 0.0))


def _sqnr_db(error: np.ndarray, r: np.ndarray) -> float:
    noise = float(np.sum(error ** 2))
    signal = float(np.sum(r ** 2))
    if noise == 0.0:
        return math.inf
    if signal == 0.0:
        return -math.inf
    return 10.0 * math.log10(signal / noise)


def _top1(r: np.ndarray, c: np.ndarray) -> float:
    return float(np.mean(np.argmax(r, axis=-1) == np.argmax(c, axis=-1)))


def is_classifier_output(array) -> bool:
    """A float [batch, classes] output with more than one class."""
    a = np.asarray(array)
    return a.ndim == 2 and a.shape[1] > 1 and np.issubdtype(a.dtype, np.floating)


def top1_agreement(reference, candidate) -> float:
    return _top1(*_pair(reference, candidate))


def drift(reference, candidate) -> dict[str, float | None]:
    """Every metric for one output, from one float64 copy of each array and one difference."""
    r, c = _pair(reference, candidate)
    error = np.abs(r - c)
    cos = _cosines(r, c)
    return {
        "max_abs": _max_abs(error),
        "mean_abs": _mean_abs(error),
        "max_rel": _max_rel(error, r),
        "cosine_min": float(np.min(cos)),
        "cosine_mean": float(np.mean(cos)),
        "sqnr_db": _sqnr_db(error, r),
        "top1": _top1(r, c) if is_classifier_output(reference) else None,
    }
