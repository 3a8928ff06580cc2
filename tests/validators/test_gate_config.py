"""The gate file: known keys, unknown keys named, flags on top."""

from __future__ import annotations

import pytest

from infopt.core.errors import UsageError
from infopt.validators.gate_config import GateConfig, load_gate_file, with_flags


def test_defaults_without_a_file():
    config = load_gate_file(None)
    assert config.latency.max_ratio == 1.10 and config.task.max_drop == 0.01
    assert config.reference is None and config.max_size_ratio is None


def test_file_values_and_flags_on_top(tmp_path):
    path = tmp_path / "gate.yaml"
    path.write_text("reference:\n  min_cosine: 0.999\ntask:\n  metric: top5\n  max_drop: 0.02\n"
                    "latency:\n  max_ratio: 1.2\n  batch_sizes: [1, 4]\nmax_size_ratio: 1.5\n")
    config = load_gate_file(path)
    assert config.reference.min_cosine == 0.999 and config.task.metric == "top5" and config.latency.batch_sizes == [1, 4]
    merged = with_flags(config, latency__max_ratio=1.05, task__max_drop=None, baseline__min_top1=0.99, max_memory_ratio=2.0)
    assert merged.latency.max_ratio == 1.05 and merged.latency.batch_sizes == [1, 4]
    assert merged.task.max_drop == 0.02  # a flag left unset keeps the file's value
    assert merged.baseline.min_top1 == 0.99 and merged.max_memory_ratio == 2.0 and merged.max_size_ratio == 1.5


@pytest.mark.parametrize("text, key, listed", [
    ("latency:\n  max_ratoi: 1.2\n", "latency.max_ratoi", "max_ratio, confidence"),
    ("max_latency: 1.2\n", "max_latency", "reference, baseline, task, latency"),
    ("reference:\n  cosine: 0.9\n", "reference.cosine", "min_cosine"),
])
def test_unknown_key_is_named_with_the_known_ones(tmp_path, text, key, listed):
    path = tmp_path / "gate.yaml"
    path.write_text(text)
    with pytest.raises(UsageError) as info:
        load_gate_file(path)
    assert info.value.exit_code == 2
    assert f"unknown key {key!r}" in info.value.what and listed in info.value.fix and str(path) in info.value.where


@pytest.mark.parametrize("text, match", [
    ("latency:\n  max_ratio: fast\n", "latency.max_ratio"),
    ("latency: [1, 2]\n", "latency"),
    ("- 1\n- 2\n", "holds a list, not a mapping"),
    ("latency:\n  max_ratio: [1\n", "not valid YAML"),
    ("latency:\n  trials: 2\n", "latency.trials"),
])
def test_malformed_gate_files(tmp_path, text, match):
    path = tmp_path / "gate.yaml"
    path.write_text(text)
    with pytest.raises(UsageError, match=match):
        load_gate_file(path)


def test_missing_gate_file(tmp_path):
    with pytest.raises(UsageError, match="cannot read the gate file"):
        load_gate_file(tmp_path / "nope.yaml")
    assert isinstance(load_gate_file(_empty(tmp_path)), GateConfig)


def _empty(tmp_path):
    path = tmp_path / "empty.yaml"
    path.write_text("")
    return path
