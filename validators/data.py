"""Validation samples from disk: a folder or file of ``.npy``/``.npz``/``.pt`` samples.

A file holds one batch: an ``.npz`` keyed by input name (or ``arr_0``... in input order), an
``.npy`` for a single-input model, or a ``.pt`` tensor / dict / list (read with
``weights_only=True``). A sample one rank short of the spec gets a batch dim of 1. Every sample
is checked against the InputSpec; a wrong dtype or shape, NaN or Inf is an error that names it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import numpy as np

from infopt.core.errors import InputSpecError, UsageError
from infopt.core.inputspec import DEFAULT_RANGE, DimRange, InputSpec, TensorSpec
from infopt.core.safe_load import arrays_file, torch_file

EXTENSIONS = (".npy", ".npz", ".pt")


def sample_files(path: Path) -> list[Path]:
    if not path.exists():
        raise UsageError(f"validation data not found: {path}", fix="pass a folder or file of .npy/.npz/.pt samples")
    if path.is_dir():
        files = sorted(p for p in path.iterdir() if p.suffix in EXTENSIONS)
        if not files:
            raise UsageError(f"no .npy/.npz/.pt files in {path}", fix="save samples with numpy.save/savez or torch.save")
        return files
    if path.suffix not in EXTENSIONS:
        raise UsageError(f"{path} is not a .npy, .npz or .pt file",
                         fix="save samples with numpy.save/savez or torch.save of tensors; text goes to --calib with --tokenizer")
    return [path]


SAMPLES_FIX = "save tensors or arrays only: torch.save of a dict of tensors, or numpy.save/savez"


def read_file(path: Path, names: tuple[str, ...]) -> dict[str, np.ndarray]:
    """One file's arrays by input name."""
    try:
        if path.suffix == ".npy":
            arrays = [arrays_file(path)]
        elif path.suffix == ".npz":
            data = arrays_file(path)
            if all(n in data for n in names):
                return {n: data[n] for n in names}
            arrays = list(data.values())
        else:
            obj = torch_file(path, what="is a sample file that holds pickled Python objects", fix=SAMPLES_FIX)
            if isinstance(obj, dict):
                return {k: v.numpy() if hasattr(v, "numpy") else np.asarray(v) for k, v in obj.items()}
            arrays = [t.numpy() for t in (obj if isinstance(obj, (list, tuple)) else [obj])]
    except UsageError:
        raise
    except Exception as exc:  # noqa: BLE001 - numpy/torch raise many types for bad files
        raise UsageError(f"cannot read sample file {path}: {type(exc).__name__}: {exc}",
                         fix="save samples with numpy.save/savez or torch.save of tensors") from exc
    if len(arrays) != len(names):
        raise InputSpecError(f"sample {path} holds {len(arrays)} arrays, the model takes {len(names)} inputs ({', '.join(names)})",
                             fix="save one array per input, keyed by input name in an .npz")
    return dict(zip(names, arrays))


def check_sample(spec: InputSpec, feed: dict[str, np.ndarray], where: str) -> dict[str, np.ndarray]:
    """The sample, batched, if it fits the spec; else an error naming the sample and input."""
    out = {}
    for tensor in spec.inputs:
        if tensor.name not in feed:
            raise InputSpecError(f"sample {where} has no input {tensor.name!r} (it has {', '.join(feed)})",
                                 fix=f"key the arrays by input name: {', '.join(spec.names)}")
        array = feed[tensor.name]
        if array.ndim == len(tensor.shape) - 1 and spec.batch_symbol:
            array = array[None]
        _check_array(spec, tensor, array, where)
        out[tensor.name] = np.ascontiguousarray(array)
    return out


def _check_array(spec: InputSpec, tensor: TensorSpec, array: np.ndarray, where: str) -> None:
    if str(array.dtype) != tensor.dtype:
        raise InputSpecError(f"sample {where} input {tensor.name} is {array.dtype}, the model takes {tensor.dtype}",
                             fix=f"save it as {tensor.dtype} (array.astype('{tensor.dtype}'))")
    if array.ndim != len(tensor.shape):
        raise InputSpecError(f"sample {where} input {tensor.name} has shape {list(array.shape)}, the spec is {tensor}",
                             fix="save samples with the shape the spec gives")
    for axis, (size, want) in enumerate(zip(array.shape, tensor.shape)):
        if isinstance(want, int) and size != want:
            raise InputSpecError(f"sample {where} input {tensor.name} has size {size} on axis {axis}, the spec says {want}",
                                 fix="save samples with the shape the spec gives")
        if axis == 0 and want == spec.batch_symbol:
            continue  # a file may hold more samples than one batch; they are split into batches
        if isinstance(want, str) and not spec.dims[want].min <= size <= spec.dims[want].max:
            r = spec.dims[want]
            raise InputSpecError(f"sample {where} input {tensor.name} has {want}={size}, outside {r.min}..{r.max}",
                                 fix=f"widen the range with --dim {want}=MIN:OPT:MAX or split the sample")
    if np.issubdtype(array.dtype, np.floating) and not np.all(np.isfinite(array)):
        raise InputSpecError(f"sample {where} input {tensor.name} contains NaN or Inf", fix="clean or drop that sample")


def load_batches(path: str | Path, spec: InputSpec, max_samples: int | None = None) -> list[dict[str, np.ndarray]]:
    """Every sample file as a checked batch, capped at ``max_samples`` samples in total."""
    batches, total = [], 0
    for file in sample_files(Path(path)):
        batch = check_sample(spec, read_file(file, spec.names), str(file))
        if max_samples is not None:
            room = max_samples - total
            if room <= 0:
                break
            batch = {k: v[:room] for k, v in batch.items()} if spec.batch_symbol else batch
        batches.append(batch)
        total += _batch_size(batch, spec)
    return batches


def split_batches(batches: list[dict[str, np.ndarray]], spec: InputSpec, size: int) -> Iterator[dict[str, np.ndarray]]:
    """Re-cut batches to at most ``size`` samples each (only where there is a batch dim)."""
    for batch in batches:
        n = _batch_size(batch, spec)
        if not spec.batch_symbol or n <= size:
            yield batch
            continue
        for start in range(0, n, size):
            yield {k: v[start:start + size] for k, v in batch.items()}


def _batch_size(batch: dict[str, np.ndarray], spec: InputSpec) -> int:
    return int(next(iter(batch.values())).shape[0]) if spec.batch_symbol else 1


def spec_from_samples(path: str | Path, names: tuple[str, ...]) -> InputSpec:
    """An InputSpec read off the first sample file: the leading dim is the batch dim, with the
    default range (a file's sample count says nothing about the batch sizes to serve)."""
    file = sample_files(Path(path))[0]
    feed = read_file(file, names or ("input",))
    spec = InputSpec.from_examples(list(feed.values()), list(feed), dynamic_batch=True)
    return spec.with_dims({"batch": DimRange(*DEFAULT_RANGE)}) if spec.batch_symbol else spec
