"""Triton Inference Server model repository: ``<repo>/<name>/config.pbtxt`` and ``1/model.onnx``.

The config is written in Triton's protobuf text format (``ModelConfig`` in Triton's
``model_config.proto``). When every input and output leads with the same dynamic batch dim,
``max_batch_size`` is that dim's max, the batch dim is left out of ``dims`` and dynamic batching
is on; otherwise ``max_batch_size`` is 0 and shapes are given whole, ``-1`` for dynamic dims.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from infopt.inputspec import InputSpec

TRITON_DTYPES = {"float32": "TYPE_FP32", "float16": "TYPE_FP16", "bfloat16": "TYPE_BF16", "float64": "TYPE_FP64",
                 "int64": "TYPE_INT64", "int32": "TYPE_INT32", "int16": "TYPE_INT16", "int8": "TYPE_INT8",
                 "uint8": "TYPE_UINT8", "bool": "TYPE_BOOL"}


def _tensor_block(name: str, dtype: str, dims: list[int]) -> str:
    return (f"  {{\n    name: \"{name}\"\n    data_type: {TRITON_DTYPES[dtype]}\n"
            f"    dims: [ {', '.join(str(d) for d in dims)} ]\n  }}")


def config_pbtxt(name: str, spec: InputSpec, outputs: list[tuple[str, str, tuple]], device: str,
                 backend: str = "onnxruntime", extra: str = "") -> str:
    """The config text; ``outputs`` are (name, dtype, shape) with symbols for dynamic dims."""
    batch = spec.batch_symbol
    batched = batch is not None and all(o[2] and o[2][0] == batch for o in outputs)
    cut = 1 if batched else 0

    def dims(shape) -> list[int]:
        return [d if isinstance(d, int) else -1 for d in shape[cut:]]

    lines = [f'name: "{name}"', f'backend: "{backend}"', f"max_batch_size: {spec.dims[batch].max if batched else 0}"]
    lines.append("input [\n" + ",\n".join(_tensor_block(t.name, t.dtype, dims(t.shape)) for t in spec.inputs) + "\n]")
    lines.append("output [\n" + ",\n".join(_tensor_block(n, d, dims(s)) for n, d, s in outputs) + "\n]")
    if batched:
        opt = spec.dims[batch].opt
        preferred = sorted({b for b in (opt, spec.dims[batch].max) if b > 1})
        lines.append("dynamic_batching {\n" + (f"  preferred_batch_size: [ {', '.join(map(str, preferred))} ]\n" if preferred else "")
                     + "  max_queue_delay_microseconds: 100\n}")
    kind = "KIND_GPU" if device == "cuda" else "KIND_CPU"
    lines.append(f"instance_group [\n  {{\n    count: 1\n    kind: {kind}\n  }}\n]")
    if extra:
        lines.append(extra)
    return "\n".join(lines) + "\n"


def write_repository(root: Path, name: str, model_file: Path, spec: InputSpec,
                     outputs: list[tuple[str, str, tuple]], device: str) -> Path:
    """Write ``root/<name>/config.pbtxt`` and ``root/<name>/1/model.onnx``; returns the model folder."""
    folder = root / name
    (folder / "1").mkdir(parents=True, exist_ok=True)
    shutil.copyfile(model_file, folder / "1" / "model.onnx")
    data = model_file.with_name(model_file.name + ".data")
    if data.exists():
        shutil.copyfile(data, folder / "1" / data.name)
    (folder / "config.pbtxt").write_text(config_pbtxt(name, spec, outputs, device))
    return folder
