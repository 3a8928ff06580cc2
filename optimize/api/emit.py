"""Writing a build's output folder: model, server layouts, validation samples, report, manifest."""

from __future__ import annotations

import datetime as _dt
import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np

from infopt.api import registries  # noqa: F401 - every registry filled, the plugins' entries included
from infopt.api.provenance import tool_versions
from infopt.core import onnx_graph
from infopt.core.errors import BuildError
from infopt.core.file_hash import copy_file
from infopt.core.manifest import file_table, sha256, write_manifest
from infopt.core.manifest_schema import SCHEMA_VERSION, FileEntry, Manifest, Timings, check_written
from infopt.core.safe_load import arrays_file
from infopt.core.step_times import StepTimes
from infopt.exporters import servers
from infopt.exporters.servers import EmitJob
from infopt.report.html import to_html
from infopt.report.markdown import to_markdown
from infopt.runtime import backends
from infopt.runtime.loading import ONNX_DTYPES

SAMPLES_FILE = "validation/samples.npz"
MAX_STORED_SAMPLES = 64
"""Validation inputs and reference outputs kept in the output folder for ``infopt validate``."""


def onnx_outputs(path: Path) -> list[tuple[str, str, tuple]]:
    """(name, dtype, shape) of each graph output, dynamic dims as their symbol names."""
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    outs = []
    for value in model.graph.output:
        kind = value.type.tensor_type
        shape = tuple(d.dim_param if d.dim_param else d.dim_value if d.HasField("dim_value") else f"d{i}"
                      for i, d in enumerate(kind.shape.dim))
        outs.append((value.name, ONNX_DTYPES.get(kind.elem_type, "float32"), shape))
    return outs


def store_samples(path: Path, batches: list[dict[str, np.ndarray]], reference: list[list[np.ndarray]],
                  output_names: tuple[str, ...], batched: bool) -> int:
    """Save up to MAX_STORED_SAMPLES inputs and the reference outputs for them."""
    if batched:
        inputs = {k: np.concatenate([b[k] for b in batches])[:MAX_STORED_SAMPLES] for k in batches[0]}
        outputs = {n: np.concatenate([r[i] for r in reference])[:MAX_STORED_SAMPLES] for i, n in enumerate(output_names)}
    else:
        inputs = dict(batches[0])
        outputs = {n: reference[0][i] for i, n in enumerate(output_names)}
    path.parent.mkdir(parents=True, exist_ok=True)
    # stored, not deflated: float outputs shrink by under a tenth and deflating them takes seconds (logits)
    np.savez(path, **{f"input.{k}": v for k, v in inputs.items()}, **{f"reference.{k}": v for k, v in outputs.items()})
    return int(next(iter(inputs.values())).shape[0]) if batched else 1


def read_samples(root: Path, manifest: Manifest) -> tuple[dict[str, np.ndarray], list[np.ndarray]]:
    """The inputs stored at build, by name, and the eager reference's outputs for them, in output order."""
    data = arrays_file(Path(root) / SAMPLES_FILE)
    inputs = {k.split(".", 1)[1]: v for k, v in data.items() if k.startswith("input.")}
    reference = [data[f"reference.{name}"] for name in manifest.output_names]
    return inputs, reference


def write_output(stage: Path, manifest: dict[str, Any], model_file: Path, spec, device: str,
                 emit: list[str] | None, attachments: dict[str, Path] | None = None,
                 server_engine: dict[str, Any] | None = None, products: dict[str, Any] | None = None,
                 times: StepTimes | None = None, model_in: str | None = None) -> Manifest:
    """Fill ``stage`` and return the completed manifest (files and their sha256 included), typed.

    ``manifest`` is everything the build knows but the files; it is checked against the manifest's
    types here, before any emitter reads it. The model is ``model/model.onnx``, ``model/model.pt2``
    (AOTInductor) or ``model/model.plan`` (TensorRT); ``server_engine`` asks the Triton config for a
    TensorRT engine built at load time. ``times``: the build's step times, ``emit`` added, become the
    manifest's ``timings``. ``model_in``: the model's path in the output where an emitter places it (a
    text-generation build's ``servers/onnxruntime-genai/model.onnx``), so the output holds its weights once: no
    ``model/`` copy (at Qwen2.5-1.5B's shape in float32, 6 GB more written and stored)."""
    start = time.perf_counter()
    rel_model = model_in or f"model/model{model_file.suffix}"
    if model_in is None:
        (stage / "model").mkdir(parents=True, exist_ok=True)
        if model_file.suffix == ".onnx":
            # its tensors go to model/model.onnx.data, the name the model now gives them and the servers look for
            onnx_graph.place_model(model_file, stage / rel_model)
        else:
            copy_file(model_file, stage / rel_model)
    artifacts = {"model": rel_model}
    for rel, source in (attachments or {}).items():
        (stage / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, stage / rel)
        if rel.startswith("servers/"):
            server = rel.split("/")[1]
            artifacts[server] = f"servers/{server}"
        else:
            artifacts[Path(rel).stem] = rel
    typed = check_written({**manifest, "artifacts": artifacts, "files": {}})
    backend = backends.for_file(model_file)
    job = EmitJob(stage, typed.name, model_file, stage / rel_model, spec, typed, device, backend, server_engine,
                  products or {})
    for emitter in servers.registered():
        wanted = emit is None or emitter.name in emit
        if wanted and emitter.serves_backend(backend) and (written := emitter.write(job)) is not None:
            setattr(typed.artifacts, emitter.name, written.relative_to(stage).as_posix())
    if model_in is not None and not (stage / model_in).is_file():
        raise BuildError(f"no emitter placed the model at {model_in}", where=str(stage),
                         fix="keep the emitter that writes it in the recipe's emit list")
    if times is not None:
        times.add("emit", time.perf_counter() - start)
        typed.timings = Timings.model_validate(times.to_json())
    typed.files = file_table(stage)
    write_reports(stage, typed)
    write_manifest(stage, typed)
    return typed


REPORTS = ("report.md", "report.html")


def write_reports(stage: Path, manifest: Manifest) -> None:
    """``report.md`` and the self-contained ``report.html``, made from the manifest (whose file
    table they show), then hashed into it, so ``infopt verify`` covers them too."""

    (stage / "report.md").write_text(to_markdown(manifest))
    (stage / "report.html").write_text(to_html(manifest))
    for rel in REPORTS:
        manifest.files[rel] = FileEntry(bytes=(stage / rel).stat().st_size, sha256=sha256(stage / rel))


VOLATILE_KEYS = frozenset({"created", "seconds", "p50_ms", "p90_ms", "p99_ms", "mean_ms", "throughput", "speedup",
                           "speedup_range",
                           "latency", "curve", "triton_tuning", "selection", "variants", "shipped_variant",
                           "memory_bandwidth_gbs", "peak_tflops", "measured", "timing_notes", "timings",
                           "cached"})
"""Manifest fields that differ between two builds of the same model with the same options: the time of
the build and every timing (and what is chosen from timings: the Triton batching tuned to the
measured curve, the words of the selection, the INT8 variants timed; a ``cpu`` target's roof, measured
at build; whether an export or a calibration came from the cache). Everything else, ``model/``
included, is byte-identical, as long as the choices made from timings come out the same: ``--backend
auto`` and INT8's ``choose: fastest`` can ship another model when two are close (pin ``--backend`` and
``choose: first`` in a recipe for reproducible builds)."""

VOLATILE_FILES = ("report.md", "report.html", "servers/torchserve/", "servers/triton/", "servers/kserve/")
"""Files that carry timings or a build time: the reports, the Triton config tuned to the measured
curve, the TorchServe archive (torch-model-archiver stamps it) and the KServe manifest beside them."""


def without_volatile(value: Any) -> Any:
    """The manifest with its volatile fields and files left out: equal for two builds of the same model."""
    if isinstance(value, dict):
        return {k: without_volatile(v) for k, v in value.items()
                if k not in VOLATILE_KEYS and not (isinstance(k, str) and k.startswith(VOLATILE_FILES))}
    if isinstance(value, list):
        return [without_volatile(v) for v in value]
    return value


def base_manifest(name: str, source: dict[str, Any], target, recipe, spec, outputs, passes, validation, *,
                  candidates: list[dict[str, Any]], selection: str, provenance: dict[str, Any],
                  shipped: str | None = None) -> dict[str, Any]:
    """Everything a build's manifest holds but ``artifacts`` and ``files`` (``write_output`` adds them
    and types the whole). ``shipped``: the precision a pass left the artifact in when it is not the recipe's
    (the INT8 pass shipped FP32 because it was faster here), or None."""
    asked = {"precision_asked": recipe.precision} if shipped and shipped != recipe.precision else {}
    return {
        "schema": SCHEMA_VERSION,
        "name": name,
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "source": source,
        "target": target.model_dump(mode="json"),
        "precision": shipped or recipe.precision,
        **asked,
        "backend": recipe.backend,
        "inputs": spec.to_json(),
        "outputs": [{"name": n, "dtype": d, "shape": list(s)} for n, d, s in outputs],
        "recipe": recipe.to_json(),
        "passes": [p.to_json() for p in passes],
        "validation": validation,
        "versions": tool_versions(),
        "candidates": candidates,
        "selection": selection,
        "provenance": provenance,
    }


def source_info(path: Path | None, fmt: str, module: Any = None) -> dict[str, Any]:
    """Where the model came from, with a sha256 that tells two builds of the same model: the file's
    bytes, each file of a folder, or for an in-memory module its state dict (names, dtypes, shapes, values)."""
    if path is None:
        return {"path": "(in-memory module)", "format": fmt, "sha256": None if module is None else _weights_sha256(module)}
    if Path(path).is_dir():
        files = {name: entry["sha256"] for name, entry in file_table(Path(path), skip=()).items()}
        return {"path": str(path), "format": fmt, "files": files}
    return {"path": str(path), "format": fmt, "sha256": sha256(path)}


def _weights_sha256(module: Any) -> str:
    import hashlib

    import torch

    digest = hashlib.sha256()
    for name, tensor in sorted(module.state_dict().items()):
        array = tensor.detach().cpu().contiguous().reshape(-1)
        digest.update(f"{name}:{array.dtype}:{tuple(tensor.shape)};".encode())
        digest.update(array.view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()
