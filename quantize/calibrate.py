"""Calibration: run an ONNX model on calibration data and record each tensor's range.

The result is a :class:`CalibrationTable` (ranges per tensor, optionally per-channel maxima),
saved as JSON and cached under ``$INFOPT_CACHE_DIR`` (default ``~/.cache/infopt``) by a key
made of the model's content hash, the data's content hash, the method and its options. A
rebuild with other thresholds, or another fallback decision, reads the table instead of
running calibration again.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from infopt.core.cache import cache_root
from infopt.core.manifest import model_sha256
from infopt.core.threads import ort_session_options
from infopt.core.work_folders import work_folder
from infopt.quantize.calib_data import CalibrationSet
from infopt.quantize.observers import Observer

log = logging.getLogger("infopt.quantize")


@dataclass
class CalibrationTable:
    method: str
    options: dict[str, Any]
    model_sha256: str
    data_sha256: str
    samples: int
    ranges: dict[str, tuple[float, float]] = field(default_factory=dict)
    channel_absmax: dict[str, list[float]] = field(default_factory=dict)
    cached: bool = False

    def to_json(self) -> dict[str, Any]:
        data = dict(self.__dict__)
        data.pop("cached")
        data["ranges"] = {k: [float(v[0]), float(v[1])] for k, v in self.ranges.items()}
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "CalibrationTable":
        data = dict(data)
        data["ranges"] = {k: (float(v[0]), float(v[1])) for k, v in data["ranges"].items()}
        return cls(**data)

    def save(self, path: Path) -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.to_json(), indent=1))
        tmp.replace(path)
        return path


def cache_dir() -> Path:
    return cache_root() / "calibration"


def calibrate(model_path: Path, tensors: list[str], data: CalibrationSet, observer: Observer, *,
              channel_tensors: list[str] = (), use_cache: bool = True) -> CalibrationTable:
    """Ranges of ``tensors`` (and per-channel maxima of ``channel_tensors``) over ``data``."""
    options = {"percentile": observer.percentile, "bins": observer.bins} if observer.needs_histogram else {}
    model_sha = model_sha256(model_path)
    key = hashlib.sha256(json.dumps([model_sha, data.digest, observer.method, options, sorted(tensors),
                                     sorted(channel_tensors)]).encode()).hexdigest()[:32]
    cached = cache_dir() / f"{key}.json"
    if use_cache and cached.is_file():
        try:
            table = CalibrationTable.from_json(json.loads(cached.read_text()))
            table.cached = True
            log.info("calibration read from cache %s", cached)
            return table
        except (ValueError, TypeError, KeyError):
            log.warning("ignoring unreadable calibration cache %s", cached)
    ranges, channel_absmax = _run(model_path, tensors, list(channel_tensors), data, observer)
    table = CalibrationTable(observer.method, options, model_sha, data.digest, data.count, ranges, channel_absmax)
    if use_cache:
        try:
            table.save(cached)
        except OSError as exc:
            log.warning("cannot write calibration cache %s: %s", cached, exc)
    return table


def _run(model_path: Path, tensors: list[str], channel_tensors: list[str], data: CalibrationSet,
         observer: Observer) -> tuple[dict[str, tuple[float, float]], dict[str, list[float]]]:
    wanted = list(dict.fromkeys([*tensors, *channel_tensors]))
    observers = {t: replace(observer) for t in tensors}
    absmax: dict[str, np.ndarray] = {}
    with work_folder("calib") as tmp:
        session = _tapped_session(model_path, wanted, Path(tmp))
        for batch in data.batches:
            for name, value in zip(wanted, session.run(wanted, batch)):
                if name in observers:
                    observers[name].observe_range(value)
                if name in channel_tensors:
                    m = np.abs(value.reshape(-1, value.shape[-1])).max(axis=0)
                    absmax[name] = m if name not in absmax else np.maximum(absmax[name], m)
        hist_names = [n for n in wanted if n in observers and observers[n].needs_histogram]
        if hist_names:
            for batch in data.batches:
                for name, value in zip(hist_names, session.run(hist_names, batch)):
                    observers[name].observe_histogram(value)
    return {t: o.range() for t, o in observers.items()}, {t: [float(x) for x in v] for t, v in absmax.items()}


def _tapped_session(model_path: Path, wanted: list[str], tmp: Path):
    """An ORT session (no graph optimizations) whose outputs include every wanted tensor."""
    import onnx
    import onnxruntime as ort

    model = onnx.load(str(model_path))
    existing = {o.name for o in model.graph.output}
    for name in wanted:
        if name not in existing:
            model.graph.output.append(onnx.helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, None))
    tapped = tmp / "tapped.onnx"
    onnx.save(model, str(tapped), save_as_external_data=True, location="tapped.onnx.data")
    options = ort_session_options(optimize=False)
    return ort.InferenceSession(str(tapped), options, providers=["CPUExecutionProvider"])
