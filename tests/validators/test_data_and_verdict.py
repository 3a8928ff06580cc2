from __future__ import annotations

import numpy as np
import pytest
import torch

from infopt.core.errors import InputSpecError, UsageError
from infopt.core.inputspec import InputSpec
from infopt.core.recipe import DriftThresholds, LatencyConfig, Validation
from infopt.validators.data import load_batches, spec_from_samples, split_batches
from infopt.validators.verdict import judge

SPEC = InputSpec.parse(["x:float32[batch,2,3]"], ["batch=1:4:8"])


def test_folder_of_mixed_files(tmp_path):
    rng = np.random.default_rng(0)
    np.save(tmp_path / "a.npy", rng.standard_normal((2, 3)).astype(np.float32))  # one sample, no batch dim
    np.savez(tmp_path / "b.npz", x=rng.standard_normal((20, 2, 3)).astype(np.float32))
    torch.save({"x": torch.randn(3, 2, 3)}, tmp_path / "c.pt")
    batches = load_batches(tmp_path, SPEC)
    assert [b["x"].shape[0] for b in batches] == [1, 20, 3]
    assert [b["x"].shape[0] for b in split_batches(batches, SPEC, 8)] == [1, 8, 8, 4, 3]
    capped = load_batches(tmp_path, SPEC, max_samples=10)
    assert sum(b["x"].shape[0] for b in capped) == 10


@pytest.mark.parametrize("array, match", [
    (np.zeros((4, 2, 3), dtype=np.float64), "float64"),
    (np.zeros((4, 2, 4), dtype=np.float32), "axis 2"),
    (np.full((4, 2, 3), np.nan, dtype=np.float32), "NaN"),
    (np.zeros((4, 6), dtype=np.float32), "shape"),
])
def test_bad_samples_are_named(tmp_path, array, match):
    np.save(tmp_path / "bad.npy", array)
    with pytest.raises(InputSpecError, match=match) as err:
        load_batches(tmp_path / "bad.npy", SPEC)
    assert "bad.npy" in str(err.value)


def test_missing_and_empty(tmp_path):
    with pytest.raises(UsageError, match="not found"):
        load_batches(tmp_path / "nope", SPEC)
    with pytest.raises(UsageError, match="no .npy"):
        load_batches(tmp_path, SPEC)


def test_spec_from_samples(tmp_path):
    np.savez(tmp_path / "s.npz", ids=np.zeros((5, 7), dtype=np.int64))
    spec = spec_from_samples(tmp_path / "s.npz", ("ids",))
    assert str(spec) == "ids:int64[batch,7]"


def test_verdict_checks_each_threshold():
    validation = Validation(drift=DriftThresholds(max_abs=1e-4, min_cosine=0.999, min_top1=0.99),
                            latency=LatencyConfig(max_p99_ms=5.0))
    good = judge(validation, {"max_abs": 1e-5, "cosine_min": 0.9999, "top1": 1.0}, [1.0, 2.0])
    assert good.passed and len(good.checks) == 4
    bad = judge(validation, {"max_abs": 1e-3, "cosine_min": 0.9999, "top1": None}, [1.0, 7.5])
    assert not bad.passed
    assert bad.reasons == ["max_abs: 0.001 (limit <= 0.0001)", "max_p99_ms: 7.5 (limit <= 5)"]


@pytest.mark.parametrize("recipe_name", ["fp32-onnxruntime", "fp32-onnxruntime-fused", "fp32-inductor", "fp32-tensorrt"])
def test_fp32_defaults_pass_rounding_at_any_scale_and_catch_a_wrong_export(recipe_name):
    """Rounding-order noise (float32 epsilon) passes however large the outputs are, as on MiniLM's
    hidden states at 512 tokens; one wrong op (the sigmoid approximation of GELU for the exact one) fails."""
    import torch

    from infopt.core.recipe import load_recipe
    from infopt.validators.metrics import drift
    from infopt.validators.verdict import judge

    validation = load_recipe(recipe_name).validation
    rng = np.random.default_rng(0)
    for scale in (1.0, 30.0, 1000.0):
        reference = (rng.standard_normal((4, 512, 384)) * scale).astype(np.float32)
        rounded = reference * (1 + rng.standard_normal(reference.shape).astype(np.float32) * 4e-7)
        assert np.abs(rounded - reference).max() > 1e-4 or scale == 1.0  # an absolute limit would fail these
        assert judge(validation, drift(reference, rounded), []).passed, scale
    x = torch.from_numpy(rng.standard_normal((64, 384)).astype(np.float32)) * 2
    exact, approximate = torch.nn.functional.gelu(x), x * torch.sigmoid(1.702 * x)
    verdict = judge(validation, drift(exact.numpy(), approximate.numpy()), [])
    assert not verdict.passed and any("sqnr" in r for r in verdict.reasons), verdict.reasons
