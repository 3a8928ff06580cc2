"""Calibration data: samples that match the InputSpec, read from disk or taken from user code.

A source is a folder or file of ``.npy``/``.npz``/``.pt`` samples (as for ``--val``), raw files
a ``reader`` turns into samples (a Hugging Face folder's task: text lines, images, ``.wav`` files
through its tokenizer, image processor or feature extractor), a text file of one example per line
with a Hugging Face ``tokenizer`` (the ``llm`` extra), any iterable
or ``DataLoader`` yielding dicts, tuples or tensors, or ``"module:function"`` naming a function
that returns one. Every sample is checked against the spec (dtype, shape, NaN, Inf)
and an error names the one that does not fit. Samples of different lengths along a symbolic
non-batch dim (``seq``) are padded with zeros to a common length: the dim's ``opt`` size, or the
longest sample if that is longer. ``samples=N`` takes N of them with a seeded draw, so the same
data and seed always give the same calibration set, and :attr:`CalibrationSet.digest` is the
content hash the calibration cache is keyed by.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

import numpy as np

from infopt.core.errors import InputSpecError, UsageError
from infopt.core.inputspec import InputSpec
from infopt.core.manifest import data_sha256
from infopt.runtime.loading import import_named
from infopt.runtime.tasks.text import read_text
from infopt.validators.data import check_sample, read_file, sample_files

DEFAULT_SAMPLES = 128
DEFAULT_BATCH = 16
MAX_HELD_OUT = 64
RawReader = Callable[[Any, InputSpec], "Iterator[tuple[str, dict[str, np.ndarray]]] | None"]


@dataclass
class CalibrationSet:
    """Checked, padded calibration samples, cut into batches."""

    batches: list[dict[str, np.ndarray]]
    count: int
    source: str
    digest: str
    held_out: list[dict[str, np.ndarray]] = field(default_factory=list)
    """Samples set aside before the draw and never calibrated on: validation data when none is given."""

    def __iter__(self):
        return iter(self.batches)


def load_calibration(source: Any, spec: InputSpec, *, samples: int | None = DEFAULT_SAMPLES, seed: int = 0,
                     batch_size: int = DEFAULT_BATCH, tokenizer: str | None = None,
                     hold_out: bool = False, reader: RawReader | None = None) -> CalibrationSet:
    """Read ``source`` into a :class:`CalibrationSet` of at most ``samples`` samples. With
    ``hold_out``, a seeded quarter of the samples (1 to :data:`MAX_HELD_OUT`) is set aside first,
    for validating on data the calibration never saw. ``reader(source, spec)`` gives samples from
    raw files it knows, or None for a source it does not."""
    if samples is not None and samples < 1:
        raise UsageError(f"--calib-samples is {samples}; it must be at least 1", fix="pass --calib-samples 128, say")
    raw = reader(source, spec) if reader is not None else None
    if raw is not None:
        items, label = raw, str(source)
    elif isinstance(source, (str, Path)) and Path(source).suffix == ".txt":
        if not Path(source).is_file():
            raise UsageError(f"calibration data not found: {source}", fix="pass a text file with one example per line")
        items, label = read_text([Path(source)], spec, tokenizer), str(source)
    else:
        items, label = _items(source, spec)

    rows: list[tuple[str, dict[str, np.ndarray]]] = []
    for where, feed in items:
        batch = check_sample(spec, feed, where)
        n = int(next(iter(batch.values())).shape[0]) if spec.batch_symbol else 1
        for i in range(n):
            rows.append((f"{where}[{i}]", {k: v[i:i + 1] if spec.batch_symbol else v for k, v in batch.items()}))
    if not rows:
        raise UsageError(f"calibration data {label} holds no samples",
                         fix="give at least one sample (a few hundred is typical)")
    held: list[tuple[str, dict[str, np.ndarray]]] = []
    if hold_out and len(rows) > 1:
        aside = set(np.random.default_rng(seed + 1).choice(len(rows), min(MAX_HELD_OUT, max(1, len(rows) // 4)),
                                                           replace=False).tolist())
        held = [row for i, row in enumerate(rows) if i in aside]
        rows = [row for i, row in enumerate(rows) if i not in aside]
    if samples is not None and len(rows) > samples:
        keep = np.sort(np.random.default_rng(seed).choice(len(rows), samples, replace=False))
        rows = [rows[i] for i in keep]
    padded = _pad(rows, spec)
    batches = _batch(padded, spec, batch_size)
    held_batches = _batch(_pad(held, spec), spec, batch_size) if held else []
    return CalibrationSet(batches, len(padded), label, _digest(batches), held_batches)


def _items(source: Any, spec: InputSpec) -> tuple[Iterable[tuple[str, dict[str, np.ndarray]]], str]:
    if isinstance(source, (str, Path)):
        path = Path(source)
        if isinstance(source, str) and not path.exists() and ":" in source:
            return _items(_from_function(source), spec)[0], source

        if not path.exists():
            raise UsageError(f"calibration data not found: {path}",
                             fix="pass --calib a folder or file of .npy/.npz/.pt samples")
        return ((str(f), read_file(f, spec.names)) for f in sample_files(path)), str(path)
    if hasattr(source, "__iter__") and not isinstance(source, dict):
        return ((f"calibration item {i}", _as_feed(item, spec, i)) for i, item in enumerate(source)), type(source).__name__
    raise UsageError(f"cannot read calibration data from a {type(source).__name__}",
                     fix="pass a path, an iterable or DataLoader, or 'module:function'")


def _from_function(text: str) -> Any:
    function = import_named(text, "the calibration function")
    return function() if callable(function) else function


def _as_feed(item: Any, spec: InputSpec, index: int) -> dict[str, np.ndarray]:
    if isinstance(item, dict):
        return {k: _array(v) for k, v in item.items()}
    values = list(item) if isinstance(item, (list, tuple)) else [item]
    if len(values) > len(spec.names) and len(spec.names) == 1:
        values = values[:1]  # (inputs, labels) pairs from a DataLoader
    if len(values) < len(spec.names):
        raise InputSpecError(f"calibration item {index} holds {len(values)} arrays, the model takes {len(spec.names)}"
                             f" ({', '.join(spec.names)})", fix="yield one array per input, or a dict keyed by input name")
    return {n: _array(v) for n, v in zip(spec.names, values)}


def _array(value: Any) -> np.ndarray:
    if hasattr(value, "detach"):
        return value.detach().cpu().numpy()
    return np.asarray(value)


def _pad(rows: list[tuple[str, dict[str, np.ndarray]]], spec: InputSpec) -> list[dict[str, np.ndarray]]:
    """Zero-pad every symbolic non-batch dim to one length so the samples stack."""
    target: dict[tuple[str, int], int] = {}
    for tensor in spec.inputs:
        for axis, dim in enumerate(tensor.shape):
            if isinstance(dim, str) and dim != spec.batch_symbol:
                longest = max(feed[tensor.name].shape[axis] for _, feed in rows)
                target[(tensor.name, axis)] = max(spec.dims[dim].opt, longest)
    out = []
    for _, feed in rows:
        padded = dict(feed)
        for (name, axis), length in target.items():
            short = length - padded[name].shape[axis]
            if short:
                widths = [(0, 0)] * padded[name].ndim
                widths[axis] = (0, short)
                padded[name] = np.pad(padded[name], widths)
        out.append(padded)
    return out


def _batch(rows: list[dict[str, np.ndarray]], spec: InputSpec, size: int) -> list[dict[str, np.ndarray]]:
    if not spec.batch_symbol:
        return rows
    return [{k: np.ascontiguousarray(np.concatenate([r[k] for r in rows[i:i + size]])) for k in spec.names}
            for i in range(0, len(rows), size)]


def _digest(batches: list[dict[str, np.ndarray]]) -> str:
    return data_sha256(batches)
