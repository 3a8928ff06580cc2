from __future__ import annotations

import math

import numpy as np
import pytest

from infopt.validators import metrics


def test_metrics_on_known_values():
    r = np.array([[1.0, -2.0, 3.0], [0.5, 0.0, -1.0]])
    c = np.array([[1.1, -2.0, 2.7], [0.5, 0.0, -1.0]])
    assert metrics.max_abs(r, c) == pytest.approx(0.3)
    assert metrics.mean_abs(r, c) == pytest.approx(0.4 / 6)
    assert metrics.max_rel(r, c) == pytest.approx(0.1)  # 0.3/3 and 0.1/1
    expected_cos = (1.1 + 4 + 8.1) / (math.sqrt(14) * math.sqrt(1.21 + 4 + 7.29))
    cos = metrics.cosine_per_sample(r, c)
    assert cos[0] == pytest.approx(expected_cos) and cos[1] == 1.0
    assert metrics.sqnr_db(r, c) == pytest.approx(10 * math.log10(15.25 / 0.1))
    assert metrics.top1_agreement(r, c) == 1.0
    assert metrics.is_classifier_output(r) and not metrics.is_classifier_output(r[0])


def test_identical_and_flipped():
    x = np.random.default_rng(0).standard_normal((4, 10))
    assert metrics.sqnr_db(x, x) == math.inf
    assert metrics.cosine(x, -x) == pytest.approx(-1.0)
    assert metrics.top1_agreement(x, -x) < 0.5


def test_shape_mismatch_raises():
    with pytest.raises(ValueError, match="shapes differ"):
        metrics.max_abs(np.zeros(3), np.zeros(4))


def test_drift_includes_top1_only_for_classifiers():
    x = np.random.default_rng(1).standard_normal((5, 3, 2)).astype(np.float32)
    assert metrics.drift(x, x)["top1"] is None
    assert metrics.drift(x[:, :, 0], x[:, :, 0])["top1"] == 1.0


def test_subnormal_outputs_count_as_zero_and_tiny_ones_keep_their_cosine():
    """A randomly initialised head that computes 1e-41 (MobileViT's tiny config does): ONNX Runtime flushes
    such subnormals to zero, and the outputs are equal at float32's precision. Outputs of 1e-30 are
    normal numbers: their cosine is computed, not floored away."""
    reference = np.full((3, 5), 3e-41, np.float32)
    flushed = np.zeros((3, 5), np.float32)
    d = metrics.drift(reference, flushed)
    assert d["cosine_min"] == 1.0 and d["max_abs"] == 0.0 and d["sqnr_db"] == float("inf")
    small = np.random.default_rng(0).standard_normal((3, 5)).astype(np.float32) * 1e-30
    assert metrics.drift(small, small * 1.001)["cosine_min"] > 0.999999
    assert metrics.drift(small, -small)["cosine_min"] == -1.0
    assert metrics.drift(small, np.zeros_like(small))["cosine_min"] == 0.0  # a candidate that lost the signal
