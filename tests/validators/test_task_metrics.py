"""Task metrics and labels read beside the validation inputs."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from infopt.core.errors import UsageError
from infopt.validators.task_metrics import read_labels, resolve

LOGITS = np.array([[0.1, 0.7, 0.2], [0.5, 0.3, 0.2], [0.2, 0.3, 0.5], [0.6, 0.3, 0.1]], dtype=np.float32)
LABELS = np.array([1, 1, 2, 2])


def test_accuracy_and_topk_by_hand():
    assert resolve(None, LABELS, LOGITS).fn(LOGITS, LABELS) == pytest.approx(0.5)  # rows 0 and 2 right
    top2 = resolve("top2", LABELS, LOGITS)
    assert top2.higher_is_better and top2.fn(LOGITS, LABELS) == pytest.approx(0.75)  # row 3's label 2 is its smallest


def test_mse_is_the_default_for_float_targets_and_lower_is_better():
    out = np.array([[1.0], [2.0], [4.0]], dtype=np.float32)
    target = np.array([1.0, 3.0, 2.0], dtype=np.float32)
    metric = resolve(None, target, out)
    assert metric.name == "mse" and not metric.higher_is_better
    assert metric.fn(out, target) == pytest.approx((0 + 1 + 4) / 3)


def test_metric_that_does_not_fit_is_a_clear_error():
    with pytest.raises(UsageError, match="integer class labels"):
        resolve("accuracy", LABELS.astype(np.float32), LOGITS)
    with pytest.raises(UsageError, match="one label per sample"):
        resolve("accuracy", LABELS[:3], LOGITS)
    with pytest.raises(UsageError, match="unknown task metric 'f1'"):
        resolve("f1", LABELS, LOGITS)


def test_user_function_metric(tmp_path, monkeypatch):
    (tmp_path / "my_metrics.py").write_text("import numpy as np\n"
                                            "def worst_margin(outputs, labels):\n"
                                            "    picked = outputs[np.arange(len(labels)), labels]\n"
                                            "    return float(picked.min())\n"
                                            "def broken(outputs, labels):\n"
                                            "    return 'good'\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    metric = resolve("my_metrics:worst_margin", LABELS, LOGITS)
    assert metric.higher_is_better and metric.fn(LOGITS, LABELS) == pytest.approx(0.1)  # row 3: its label 2 scores 0.1
    assert not resolve("my_metrics:worst_margin", LABELS, LOGITS, higher_is_better=False).higher_is_better
    with pytest.raises(UsageError, match="returned str, not a number"):
        resolve("my_metrics:broken", LABELS, LOGITS).fn(LOGITS, LABELS)
    with pytest.raises(UsageError, match="cannot import the task metric my_metrics:missing"):
        resolve("my_metrics:missing", LABELS, LOGITS)
    sys.modules.pop("my_metrics", None)


def test_labels_follow_the_inputs_file_by_file(tmp_path):
    folder = tmp_path / "val"
    folder.mkdir()
    np.savez(folder / "a.npz", x=np.zeros((3, 2), np.float32), labels=np.array([0, 1, 2]))
    np.savez(folder / "b.npz", x=np.zeros((4, 2), np.float32), labels=np.array([3, 4, 5, 6]))
    # the inputs were capped at 5 samples: 3 from a.npz, 2 from b.npz
    assert read_labels(folder, "labels", [3, 2]).tolist() == [0, 1, 2, 3, 4]
    assert read_labels(folder, "y", [3, 2]) is None
    np.savez(folder / "b.npz", x=np.zeros((4, 2), np.float32), labels=np.array([3]))
    with pytest.raises(UsageError, match="holds 1 labels for 2 samples"):
        read_labels(folder, "labels", [3, 2])
    np.savez(folder / "b.npz", x=np.zeros((4, 2), np.float32))
    with pytest.raises(UsageError, match="has no 'labels' array, though earlier files do"):
        read_labels(folder, "labels", [3, 2])
