"""Observers turn real value distributions into ranges; calibration tables are cached by content."""

from __future__ import annotations

import json

import numpy as np
import pytest

from infopt.core.errors import UsageError
from infopt.core.inputspec import InputSpec
from infopt.quantize.calib_data import load_calibration
from infopt.quantize.calibrate import calibrate
from infopt.quantize.observers import Observer
from tests.quantize.helpers import layernorm_matmul


def observe(method, values, **kw):
    obs = Observer(method, **kw)
    for chunk in np.array_split(values, 4):
        obs.observe_range(chunk)
    for chunk in np.array_split(values, 4):
        obs.observe_histogram(chunk)
    return obs.range()


@pytest.fixture(scope="module")
def heavy_tailed():
    rng = np.random.default_rng(0)
    values = rng.standard_normal(200_000).astype(np.float32)
    values[:20] = 60.0  # rare outliers far outside the bulk
    return values


def test_minmax_is_exact_and_includes_zero():
    assert observe("minmax", np.array([0.5, 2.0, 3.0], np.float32)) == (0.0, 3.0)
    assert observe("minmax", np.array([-4.0, -1.0], np.float32)) == (-4.0, 0.0)


def fake_quant_error(values, lo, hi):
    a = max(-lo, hi)
    step = a / 127.0
    return float(np.mean((np.clip(np.round(values / step), -127, 127) * step - values) ** 2))


def test_percentile_and_entropy_clip_rare_outliers(heavy_tailed):
    lo, hi = observe("minmax", heavy_tailed)
    assert hi == 60.0
    for method in ("percentile", "entropy"):
        clo, chi = observe(method, heavy_tailed)
        assert 2.0 < chi < 20.0, (method, chi)  # outliers saturate, the bulk (|x| < ~4.5) stays
        assert -20.0 < clo < -2.0, (method, clo)


def test_mse_range_has_the_least_quantization_error(heavy_tailed):
    errors = {m: fake_quant_error(heavy_tailed, *observe(m, heavy_tailed)) for m in ("minmax", "percentile", "entropy", "mse")}
    assert errors["mse"] <= min(errors.values()) * 1.05, errors


def test_percentile_option_moves_the_range(heavy_tailed):
    _, hi_999 = observe("percentile", heavy_tailed, percentile=99.9)
    _, hi_99 = observe("percentile", heavy_tailed, percentile=99.0)
    assert 2.2 < hi_99 < hi_999 < 3.5  # each tail cut: N(0,1) 99th ~2.33, 99.9th ~3.09


def test_entropy_bin_count_reaches_the_histogram(heavy_tailed):
    coarse, fine = Observer("entropy", bins=256), Observer("entropy", bins=4096)
    for obs in (coarse, fine):
        obs.observe_range(heavy_tailed)
        obs.observe_histogram(heavy_tailed)
    assert coarse.hist.shape == (256,) and fine.hist.shape == (4096,)
    assert coarse.range() != fine.range()


@pytest.mark.parametrize("kwargs, message", [({"method": "kl"}, "unknown calibration method"),
                                             ({"method": "entropy", "bins": 100}, "bins"),
                                             ({"method": "percentile", "percentile": 20.0}, "percentile")])
def test_bad_observer_options(kwargs, message):
    with pytest.raises(UsageError, match=message):
        Observer(**kwargs)


def test_calibration_ranges_match_the_tensors_and_are_cached(tmp_path, monkeypatch):
    monkeypatch.setenv("INFOPT_CACHE_DIR", str(tmp_path / "cache"))
    model = layernorm_matmul(tmp_path / "m.onnx")
    x = np.random.default_rng(1).standard_normal((64, 16)).astype(np.float32)
    data = load_calibration([x], InputSpec.parse(["x:float32[batch,16]"]), samples=None)
    table = calibrate(model, ["ln", "h"], data, Observer("minmax"), channel_tensors=["ln"])
    mean, std = x.mean(-1, keepdims=True), x.std(-1, keepdims=True)
    gamma = np.ones(16, np.float32)
    gamma[3] = 40.0
    ln = (x - mean) / np.sqrt(std ** 2 + 1e-5) * gamma
    assert table.ranges["ln"] == pytest.approx((ln.min(), ln.max()), rel=1e-4)
    assert np.argmax(table.channel_absmax["ln"]) == 3
    assert not table.cached
    again = calibrate(model, ["ln", "h"], data, Observer("minmax"), channel_tensors=["ln"])
    assert again.cached and again.ranges == table.ranges
    other = calibrate(model, ["ln", "h"], data, Observer("percentile", percentile=99.0))
    assert not other.cached and other.ranges["ln"][1] < table.ranges["ln"][1]
    saved = json.loads(table.save(tmp_path / "t.json").read_text())
    assert saved["method"] == "minmax" and saved["samples"] == 64 and len(saved["model_sha256"]) == 64
