"""Task metrics on labelled validation data: how well a model does its job, not how close it is
to another model.

Labels live beside the inputs in each sample file, under a key (``labels`` by default) of an
``.npz`` or of a ``.pt`` dict. Metrics: ``accuracy`` (argmax over the last axis equals the label),
``topK`` such as ``top5`` (the label is among the K largest), ``mse`` (mean squared error against
float targets; lower is better) or ``module:function``, called as ``function(outputs, labels)``
with the chosen output and the labels as numpy arrays, returning a float.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from infopt.core.errors import UsageError
from infopt.core.safe_load import arrays_file, torch_file
from infopt.runtime.loading import import_named
from infopt.validators.data import SAMPLES_FIX, sample_files


@dataclass
class TaskMetric:
    name: str
    fn: Callable[[np.ndarray, np.ndarray], float]
    higher_is_better: bool


def read_labels(path: str | Path, key: str, counts: list[int]) -> np.ndarray | None:
    """The labels of every sample file, in file order and cut to the samples used (``counts``
    per file, as the inputs were read); None when no file holds ``key``."""
    files = sample_files(Path(path))
    found = []
    for file, count in zip(files, counts):
        labels = _labels_of(file, key)
        if labels is None:
            if found:
                raise UsageError(f"sample file {file} has no {key!r} array, though earlier files do",
                                 fix=f"store the labels under {key!r} in every sample file")
            return None
        labels = np.asarray(labels)
        if labels.ndim == 0 or labels.shape[0] < count:
            raise UsageError(f"sample file {file}: {key!r} holds {labels.shape[0] if labels.ndim else 0} labels for {count} samples",
                             fix="store one label per sample, along the first axis")
        found.append(labels[:count])
    return np.concatenate(found) if found else None


def _labels_of(file: Path, key: str):
    if file.suffix == ".npz":
        return arrays_file(file).get(key)
    if file.suffix == ".pt":
        obj = torch_file(file, what="is a sample file that holds pickled Python objects", fix=SAMPLES_FIX)
        if isinstance(obj, dict) and key in obj:
            value = obj[key]
            return value.numpy() if hasattr(value, "numpy") else np.asarray(value)
    return None


def accuracy(outputs: np.ndarray, labels: np.ndarray) -> float:
    return topk(1)(outputs, labels)


def topk(k: int) -> Callable[[np.ndarray, np.ndarray], float]:
    def score(outputs: np.ndarray, labels: np.ndarray) -> float:
        flat = outputs.reshape(outputs.shape[0], -1) if outputs.ndim > 2 else outputs
        best = np.argpartition(-flat, kth=min(k, flat.shape[-1]) - 1, axis=-1)[:, :k]
        return float(np.mean(np.any(best == labels.reshape(-1, 1), axis=-1)))

    return score


def mse(outputs: np.ndarray, labels: np.ndarray) -> float:
    return float(np.mean((outputs.astype(np.float64) - labels.reshape(outputs.shape).astype(np.float64)) ** 2))


def resolve(name: str | None, labels: np.ndarray, outputs: np.ndarray, higher_is_better: bool | None = None) -> TaskMetric:
    """The metric ``name`` names, or the default for these labels: accuracy for integer labels,
    mse for float ones. A metric that does not fit the outputs is an error saying why."""
    integer = np.issubdtype(labels.dtype, np.integer)
    if name is None:
        name = "accuracy" if integer else "mse"
    match = re.fullmatch(r"top(\d+)", name)
    if name == "accuracy" or match:
        if not integer:
            raise UsageError(f"task metric {name} needs integer class labels; the labels are {labels.dtype}",
                             fix="use --task-metric mse for float targets, or store class indices")
        if outputs.ndim < 2 or labels.reshape(-1).shape[0] != outputs.shape[0]:
            raise UsageError(f"task metric {name} needs [samples, classes] outputs and one label per sample; "
                             f"the output is {list(outputs.shape)} and there are {labels.size} labels",
                             fix="pick the classifier output with task.output, or use another metric")
        k = int(match.group(1)) if match else 1
        return TaskMetric(name, topk(k), True)
    if name == "mse":
        if labels.size != outputs.size:
            raise UsageError(f"task metric mse needs one target per output value; the output is {list(outputs.shape)}, "
                             f"the labels {list(labels.shape)}", fix="store targets shaped like the output")
        return TaskMetric(name, mse, False)
    if ":" in name:
        return TaskMetric(name, _user_function(name), True if higher_is_better is None else higher_is_better)
    raise UsageError(f"unknown task metric {name!r}", fix="use accuracy, topK (e.g. top5), mse or module:function")


def _user_function(text: str) -> Callable[[np.ndarray, np.ndarray], float]:
    fn = import_named(text, "the task metric")
    if not callable(fn):
        raise UsageError(f"task metric {text} is not a function", fix="name a function(outputs, labels) -> float as module:function")

    def score(outputs: np.ndarray, labels: np.ndarray) -> float:
        value = fn(outputs, labels)
        try:
            return float(value)
        except (TypeError, ValueError):
            raise UsageError(f"task metric {text} returned {type(value).__name__}, not a number",
                             fix="return a float from function(outputs, labels)") from None

    return score
