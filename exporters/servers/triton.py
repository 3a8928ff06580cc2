"""Triton Inference Server model repository: ``<repo>/<name>/config.pbtxt`` and ``<name>/1/model.*``.

The config is written in Triton's protobuf text format (``ModelConfig`` in Triton's
``model_config.proto``). When every input and output leads with the same dynamic batch dim,
``max_batch_size`` is that dim's max, the batch dim is left out of ``dims`` and dynamic batching
is on; otherwise ``max_batch_size`` is 0 and shapes are given whole, ``-1`` for dynamic dims.

The model file's suffix picks the backend:

- ``.onnx``: ONNX Runtime backend (``backend: "onnxruntime"``). With ``server_engine`` the config
  adds the TensorRT execution accelerator, which builds the engine when the model loads; its
  parameters (``precision_mode``, ``max_workspace_size_bytes``, ``trt_engine_cache_enable``,
  ``trt_engine_cache_path``, ``trt_profile_{min,opt,max}_shapes``) are those the
  onnxruntime_backend README documents.
- ``.plan``: TensorRT backend (``platform: "tensorrt_plan"``, ``1/model.plan``), always on a GPU.
- ``.pt2``: an AOTInductor package served by the Python backend (``backend: "python"``):
  ``1/model.pt2`` beside a ``1/model.py`` that loads it. The Python environment Triton runs the
  model in must have a torch build matching the one that compiled the package.

A text-generation build gets a decoupled Python-backend model generating from its ONNX Runtime GenAI
folder instead (``triton_genai.py``), answering Triton's generate endpoint.
"""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path
from typing import Any

from infopt.core.errors import UsageError
from infopt.core.file_hash import copy_file
from infopt.core.inputspec import InputSpec
from infopt.exporters.genai_folder import GenaiFolder
from infopt.exporters.servers.emitter import EmitJob, ServerEmitter, register
from infopt.exporters.servers.triton_genai import write_generation_model
from infopt.exporters.servers.triton_tuning import TRITON_DTYPES, Tuning, tune

ENGINE_CACHE_ROOT = "/tmp/triton_trt_engines"
"""Where the server keeps the engines it builds, one folder per model, unless ``cache_path`` is given."""

PYTHON_MODEL = (files("infopt.exporters.servers") / "programs" / "triton_python_model.py").read_text()
"""The program shipped beside the model, kept as a real file (``programs/triton_python_model.py``) so it is linted and tested."""


def _tensor_block(name: str, dtype: str, dims: list[int]) -> str:
    return (f"  {{\n    name: \"{name}\"\n    data_type: {TRITON_DTYPES[dtype]}\n"
            f"    dims: [ {', '.join(str(d) for d in dims)} ]\n  }}")


def _batching_block(preferred: list[int], delay_us: int) -> str:
    sizes = f"  preferred_batch_size: [ {', '.join(map(str, preferred))} ]\n" if preferred else ""
    return f"dynamic_batching {{\n{sizes}  max_queue_delay_microseconds: {delay_us}\n}}"


def _warmup_block(entries: list[dict[str, Any]]) -> str:
    """``model_warmup`` in text format; ``entries`` as in ``Tuning.warmup``."""
    blocks = []
    for entry in entries:
        inputs = ""
        for name, tensor in entry["inputs"].items():
            fill = "random_data" if tensor.get("random_data") else "zero_data"
            inputs += (f'    inputs {{\n      key: "{name}"\n      value {{\n        data_type: {tensor["data_type"]}\n'
                       f"        dims: [ {', '.join(str(d) for d in tensor['dims'])} ]\n        {fill}: true\n      }}\n    }}\n")
        blocks.append(f'  {{\n    name: "{entry["name"]}"\n    batch_size: {entry["batch_size"]}\n{inputs}'
                      f"    count: {entry['count']}\n  }}")
    return "model_warmup [\n" + ",\n".join(blocks) + "\n]"


def max_batch_size(spec: InputSpec, outputs: list[tuple[str, str, tuple]]) -> int:
    """The config's ``max_batch_size``: the batch dim's max when every input and output leads with it, else 0."""
    batch = spec.batch_symbol
    batched = batch is not None and all(o[2] and o[2][0] == batch for o in outputs)
    return spec.dims[batch].max if batched and batch is not None else 0


def config_pbtxt(name: str, spec: InputSpec, outputs: list[tuple[str, str, tuple]], device: str,
                 backend: str = "onnxruntime", extra: str = "", platform: str | None = None, *,
                 tuning: Tuning | None = None) -> str:
    """The config text; ``outputs`` are (name, dtype, shape) with symbols for dynamic dims.

    ``platform`` (such as ``tensorrt_plan``) replaces the ``backend`` line when given. ``tuning``
    (from :func:`infopt.exporters.servers.triton_tuning.tune`) sets the dynamic batcher, the
    instance group and the warm-up; without it the batcher prefers the batch dim's opt and max,
    waits 100 us, and one instance serves."""
    max_batch = max_batch_size(spec, outputs)
    cut = 1 if max_batch else 0
    kind = "KIND_GPU" if device == "cuda" else "KIND_CPU"
    if tuning is not None:
        _check_tuning(tuning, max_batch, kind)

    def dims(shape) -> list[int]:
        return [d if isinstance(d, int) else -1 for d in shape[cut:]]

    engine_line = f'platform: "{platform}"' if platform else f'backend: "{backend}"'
    lines = [f'name: "{name}"', engine_line, f"max_batch_size: {max_batch}"]
    lines.append("input [\n" + ",\n".join(_tensor_block(t.name, t.dtype, dims(t.shape)) for t in spec.inputs) + "\n]")
    lines.append("output [\n" + ",\n".join(_tensor_block(n, d, dims(s)) for n, d, s in outputs) + "\n]")
    if tuning is not None:
        if tuning.dynamic_batching:
            lines.append(_batching_block(tuning.preferred_batch_sizes, tuning.max_queue_delay_us))
    elif max_batch and spec.batch_symbol:
        batch = spec.dims[spec.batch_symbol]
        lines.append(_batching_block(sorted({b for b in (batch.opt, batch.max) if b > 1}), 100))
    count = tuning.instance_count if tuning is not None else 1
    lines.append(f"instance_group [\n  {{\n    count: {count}\n    kind: {kind}\n  }}\n]")
    if extra:
        lines.append(extra)
    if tuning is not None and tuning.warmup:
        lines.append(_warmup_block(tuning.warmup))
    return "\n".join(lines) + "\n"


def _check_tuning(tuning: Tuning, max_batch: int, kind: str) -> None:
    """A tuning made for another batch layout or device would give warm-up dims or instances that do not fit."""
    if tuning.max_batch != max_batch:
        raise UsageError(f"the Triton tuning was made for max_batch_size {tuning.max_batch}, but this config has {max_batch}",
                         fix="call tune() with max_batch=max_batch_size(spec, outputs)")
    if tuning.instance_kind != kind:
        raise UsageError(f"the Triton tuning was made for {tuning.instance_kind}, but this model is served on {kind}",
                         fix='call tune() with the device the server runs the model on ("cuda" for TensorRT engines)')


def profile_shapes(spec: InputSpec, pick: str) -> str:
    """``name:1x3x224x224,name2:1x16`` for the inputs with dynamic dims, at their min/opt/max."""
    return ",".join(f"{t.name}:" + "x".join(str(d) for d in spec.concrete_shape(t, pick))
                    for t in spec.inputs if t.symbols)


def tensorrt_accelerator(name: str, spec: InputSpec, server_engine: dict[str, Any]) -> str:
    """The ``optimization`` block that has the ONNX Runtime backend build a TensorRT engine at load.

    ``server_engine`` holds ``precision_mode`` (FP32, FP16 or INT8), ``workspace_bytes`` and
    optionally ``cache_path``; the engine is cached there, so it is built once per GPU."""
    params = {"precision_mode": server_engine["precision_mode"],
              "max_workspace_size_bytes": str(int(server_engine["workspace_bytes"])),
              "trt_engine_cache_enable": "1",
              "trt_engine_cache_path": server_engine.get("cache_path") or f"{ENGINE_CACHE_ROOT}/{name}"}
    if spec.symbols:
        for pick in ("min", "opt", "max"):
            params[f"trt_profile_{pick}_shapes"] = profile_shapes(spec, pick)
    body = "\n".join(f'      parameters {{ key: "{k}" value: "{v}" }}' for k, v in params.items())
    return ("optimization {\n  execution_accelerators {\n    gpu_execution_accelerator: [\n"
            f'      {{\n      name: "tensorrt"\n{body}\n      }}\n    ]\n  }}\n}}')


def write_repository(root: Path, name: str, model_file: Path, spec: InputSpec,
                     outputs: list[tuple[str, str, tuple]], device: str, *,
                     server_engine: dict[str, Any] | None = None, tuning: Tuning | None = None) -> Path:
    """Write ``root/<name>/config.pbtxt`` and ``root/<name>/1/model.<suffix>``; returns the model folder.

    ``tuning`` is passed to :func:`config_pbtxt`; it must be made for the device the model is
    served on, which is ``cuda`` for a ``.plan`` or a server-built engine."""
    suffix = model_file.suffix
    if suffix not in (".onnx", ".plan", ".pt2"):
        raise UsageError(f"Triton cannot serve {model_file.name}", where=str(model_file),
                         fix="give an .onnx, .plan (TensorRT) or .pt2 (AOTInductor) model")
    if server_engine is not None and suffix != ".onnx":
        raise UsageError(f"a server-built TensorRT engine needs an ONNX model, not {model_file.name}",
                         fix="drop server_engine, or pass the .onnx model")
    folder = root / name
    version = folder / "1"
    version.mkdir(parents=True, exist_ok=True)
    copy_file(model_file, version / f"model{suffix}")
    if suffix == ".onnx":
        data = model_file.with_name(model_file.name + ".data")
        if data.exists():
            copy_file(data, version / data.name)
        if server_engine is None:
            text = config_pbtxt(name, spec, outputs, device, tuning=tuning)
        else:
            text = config_pbtxt(name, spec, outputs, "cuda", extra=tensorrt_accelerator(name, spec, server_engine),
                                tuning=tuning)
    elif suffix == ".plan":
        text = config_pbtxt(name, spec, outputs, "cuda", platform="tensorrt_plan", tuning=tuning)
    else:
        (version / "model.py").write_text(PYTHON_MODEL)
        text = config_pbtxt(name, spec, outputs, device, backend="python", tuning=tuning)
    (folder / "config.pbtxt").write_text(text)
    return folder


def emit(job: EmitJob) -> Path:
    """The repository under ``servers/triton/``, its batching tuned to the measured latency curve
    (recorded in the manifest as ``triton_tuning``); for a text-generation build, the Python backend generating
    from its GenAI folder (``triton_genai.py``)."""
    if job.products.get(GenaiFolder) is not None:
        return write_generation_model(job.stage / "servers" / "triton", job.name)
    outputs = [(o.name, o.dtype, tuple(o.shape)) for o in job.manifest.outputs]
    validation = job.manifest.validation
    tuning = tune(validation.curve, job.device, job.spec, max_batch_size(job.spec, outputs),
                  measured_on_target=(validation.runs_on or job.device) == job.device)
    job.manifest.triton_tuning = tuning.to_json()
    # the staged model: its external data, if any, is in the <name>.data beside it that the model names
    return write_repository(job.stage / "servers" / "triton", job.name, job.staged_model, job.spec, outputs, job.device,
                            server_engine=job.server_engine, tuning=tuning)


SERVES = {
    "onnx": "the onnxruntime backend (the TensorRT accelerator with server_engine); a text-generation build's GenAI "
            "folder through the Python backend and onnxruntime_genai, on the generate endpoint",
    "aoti": "the Python backend, model.py loading model.pt2",
    "tensorrt": "the TensorRT backend (platform tensorrt_plan)",
}
"""the representations this server serves, and how"""

EMITTER = register(ServerEmitter("triton", 10, emit, SERVES))
