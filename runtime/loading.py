"""Loading a model file into an Artifact, without unpickling anything the user did not allow.

Formats, told apart by their contents rather than their names: an ONNX file; a ``torch.export``
``.pt2`` archive; a TorchScript archive; a ``torch.save`` state dict (with ``--model-class``);
and a fully pickled ``nn.Module``, which is loaded only with ``allow_pickle=True`` because
unpickling runs code named by the file.
"""

from __future__ import annotations

import importlib
import json
import re
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from infopt.core.artifact import Artifact
from infopt.core.errors import InputSpecError, ModelLoadError, UnsafePickleError, UsageError
from infopt.core.inputspec import DimRange, InputSpec, TensorSpec, dtype_name
from infopt.core.safe_load import exported_program, pickled_classes, refuse, torch_file
from infopt.runtime import hub
from infopt.runtime.hf_folder import is_hf_folder, load_hf_folder


@dataclass
class LoadedModel:
    """A model as loaded: its first artifact, its format and the eager reference to validate against."""

    artifact: Artifact | None
    format: str
    source: Path
    module: Any = None
    """The eager module (``nn.Module``, ``ScriptModule``) or ``None`` for ONNX."""
    arg_names: tuple[str, ...] = ()
    spec: InputSpec | None = None
    name: str | None = None
    """the model's own name for its output folder, where the source says one (a Hugging Face folder or id)"""
    hub: Any = None
    """the ``runtime.hub.HubSnapshot`` it came from, for a Hugging Face model id"""
    task: Any = None
    """the ``runtime.tasks.Task`` of a Hugging Face folder: its inputs, outputs and raw-data readers"""

    def with_spec(self, spec: InputSpec) -> Artifact:
        kind = "onnx" if self.format == "onnx" else "exported" if self.format == "pt2" else "torch"
        obj = None if self.format == "onnx" else self.artifact.obj if self.artifact else self.module
        path = self.source if self.format == "onnx" else None
        names = self.artifact.output_names if self.artifact else ()
        self.artifact = Artifact(kind, spec, path=path, obj=obj, output_names=names)
        self.spec = spec
        return self.artifact


def sniff(path: Path) -> str:
    """Which format a path holds: onnx, pt2, torchscript, torch-save, torch-save-legacy, hf-folder."""
    if not path.exists():
        raise ModelLoadError(f"model file not found: {path}", fix="check the path; it is relative to the current folder")
    if path.is_dir():
        if is_hf_folder(path):
            return "hf-folder"
        raise ModelLoadError(f"{path} is a folder but not a Hugging Face model folder (it has no config.json)",
                             fix="pass a .pt/.pt2/.onnx file, or a folder with config.json and .safetensors weights")
    head = path.read_bytes()[:4] if path.stat().st_size else b""
    if not head:
        raise ModelLoadError(f"{path} is empty (0 bytes)", fix="re-save the model; the file was not written completely")
    if zipfile.is_zipfile(path):
        try:
            with zipfile.ZipFile(path) as archive:
                names = archive.namelist()
                bad = archive.testzip()
        except (zipfile.BadZipFile, OSError, EOFError) as exc:
            raise _corrupt(path, exc) from exc
        if bad is not None:
            raise _corrupt(path, f"entry {bad} fails its checksum")
        if any(n.endswith("/archive_format") or n.endswith("serialized_exported_program.json") for n in names):
            return "pt2"
        if any("/code/" in n for n in names) and any(n.endswith("constants.pkl") for n in names):
            return "torchscript"
        if any(n.endswith("data.pkl") for n in names):
            return "torch-save"
        raise ModelLoadError(f"{path} is a zip archive but not a PyTorch or ONNX model", fix=_FORMATS_HINT)
    if head[:2] == b"PK":
        raise _corrupt(path, "the zip archive is truncated")
    if head[:1] == b"\x80":
        return "torch-save-legacy"
    if path.suffix.lower() == ".onnx" or head[:1] == b"\x08":
        return "onnx"
    raise ModelLoadError(f"{path} is not a model file infopt can read", fix=_FORMATS_HINT)


_FORMATS_HINT = ("save the model as TorchScript (torch.jit.save), torch.export (.pt2), a state_dict "
                 "(torch.save(model.state_dict()) with --model-class) or ONNX")


def _first(exc: Exception) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _corrupt(path: Path, why: Any) -> ModelLoadError:
    return ModelLoadError(f"{path} is corrupt or truncated: {why}",
                          fix="re-save or re-download the file; compare its size and checksum with the original")


def _class_not_importable(path: Path, exc: Exception) -> ModelLoadError:
    """The pickle names a class this process cannot import: most often one defined in the script that saved it."""
    found = re.search(r"attribute '([^']+)' on <module '([^']+)'", str(exc))
    named = f"{found.group(2)}.{found.group(1)}" if found else None
    if isinstance(exc, ModuleNotFoundError):
        named = f"module {exc.name}"
    main = found is not None and found.group(2) == "__main__"
    return ModelLoadError(
        f"{path} pickles the model's class by name, and {named or 'its class'} cannot be imported here"
        + (" (it was defined in the script that saved the model)" if main else ""),
        fix="save the weights (torch.save(model.state_dict(), 'model.pt')) and pass --model-class pkg.module:Class, "
            "or save TorchScript (torch.jit.save) or torch.export (.pt2), which need no class",
    )


def load_model(path: str | Path, *, model_class: str | None = None, model_args: str | dict | None = None,
               allow_pickle: bool = False, stored_dtype: bool = False) -> LoadedModel:
    """The model at ``path``: a file or folder here, or a Hugging Face model id (``org/name[@revision]``). With
    ``stored_dtype`` a Hugging Face folder of bf16 weights loads in bf16 (see :func:`load_hf_folder`)."""
    if hub.is_hub_id(path):
        snapshot = hub.snapshot(str(path))
        loaded = load_model(snapshot.folder, stored_dtype=stored_dtype)
        loaded.hub, loaded.name = snapshot, snapshot.repo_id.split("/")[-1]
        return loaded
    path = Path(path)
    fmt = sniff(path)
    if fmt == "onnx":
        return _load_onnx(path)
    if fmt == "hf-folder":
        found = load_hf_folder(path, stored_dtype=stored_dtype)
        art = Artifact("torch", found.spec, obj=found.module, output_names=found.output_names)
        return LoadedModel(art, "hf-folder", path, found.module, found.spec.names, found.spec, name=found.default_name,
                           task=found.task)
    import torch

    if fmt == "pt2":
        try:
            program = exported_program(path, allow_pickle=allow_pickle)
            module = program.module()
        except UnsafePickleError:
            raise
        except Exception as exc:  # noqa: BLE001 - any failure here means the archive is unusable
            raise _corrupt(path, f"torch.export.load: {_first(exc)}") from exc
        spec = spec_from_exported(program)
        art = Artifact("exported", spec, obj=program, output_names=_output_names(program))
        return LoadedModel(art, "pt2", path, module, spec.names, spec)
    if fmt == "torchscript":
        try:
            module = torch.jit.load(str(path), map_location="cpu").eval()
        except Exception as exc:  # noqa: BLE001
            raise _corrupt(path, f"torch.jit.load: {exc}") from exc
        names = tuple(a.name for a in module.forward.schema.arguments[1:])
        return LoadedModel(None, "torchscript", path, module, names)
    return _load_torch_save(path, fmt, model_class, model_args, allow_pickle)


def _load_onnx(path: Path) -> LoadedModel:
    import onnx

    try:
        model = onnx.load(str(path), load_external_data=False)
        onnx.checker.check_model(str(path))  # by path: external data is found beside the model, and may pass 2 GB
    except Exception as exc:  # noqa: BLE001 - protobuf and checker errors
        raise ModelLoadError(f"{path} is not a valid ONNX model: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}",
                             fix="re-export it, or run onnx.checker.check_model on it for details") from exc
    spec = spec_from_onnx(model)
    art = Artifact("onnx", spec, path=path, output_names=tuple(o.name for o in model.graph.output))
    return LoadedModel(art, "onnx", path, None, spec.names, spec)


def _load_torch_save(path, fmt, model_class, model_args, allow_pickle) -> LoadedModel:
    import torch

    if allow_pickle:
        try:
            obj = torch_file(path, allow_pickle=True)
        except (AttributeError, ModuleNotFoundError) as exc:
            raise _class_not_importable(path, exc) from exc
        except Exception as exc:  # noqa: BLE001
            raise _corrupt(path, f"torch.load: {exc}") from exc
        if isinstance(obj, torch.nn.Module):
            return from_module(obj.eval(), "pickle", path)
        if _state_dict_of(obj) is None:
            raise ModelLoadError(f"{path} holds a {type(obj).__name__}, not a model or a state_dict", fix=_FORMATS_HINT)
    else:
        classes = pickled_classes(path) if fmt == "torch-save" else []
        if classes:
            raise _refuse_pickle(path, classes)
        try:
            obj = torch_file(path, what="is a pickled Python object")
        except UnsafePickleError:
            raise _refuse_pickle(path, []) from None
        except Exception as exc:  # noqa: BLE001 - the file is bad
            raise _corrupt(path, f"torch.load: {str(exc).splitlines()[0]}") from exc
    state = _state_dict_of(obj)
    if state is None:
        raise ModelLoadError(f"{path} holds a {type(obj).__name__}, not a state_dict of tensors", fix=_FORMATS_HINT)
    if not model_class:
        raise UsageError(f"{path} is a state_dict: weights without the model's code",
                         fix="pass --model-class pkg.module:Class (and --model-args JSON for its constructor)")
    module = instantiate(model_class, model_args)
    try:
        missing, unexpected = _load_state(module, state)
    except RuntimeError as exc:  # shape mismatches raise even with strict=False
        detail = "; ".join(line.strip() for line in str(exc).splitlines()[1:4])
        raise ModelLoadError(f"state_dict does not fit {model_class}: {detail}", where=str(path),
                             fix="check --model-class and --model-args match the model that saved the weights") from exc
    if missing or unexpected:
        raise ModelLoadError(
            f"state_dict does not fit {model_class}: missing {', '.join(missing[:5]) or 'none'}; "
            f"unexpected {', '.join(unexpected[:5]) or 'none'}",
            where=str(path), fix="check --model-class and --model-args match the model that saved the weights")
    return from_module(module.eval(), "state_dict", path)


def from_module(module, fmt: str, path: Path | None) -> LoadedModel:
    """A LoadedModel around a module already in memory (``fmt`` says how it came: module, pickle, state_dict)."""
    import inspect

    try:
        names = tuple(p for p in inspect.signature(module.forward).parameters if p not in ("args", "kwargs"))
    except (TypeError, ValueError):
        names = ()
    return LoadedModel(None, fmt, path, module, names)


def _refuse_pickle(path: Path, classes: list[str]):
    return refuse(path, "is a pickled Python object", classes, fix=(
        "if you trust the file, pass --allow-pickle; better, re-save the model as TorchScript (torch.jit.save), "
        "torch.export (.pt2), or torch.save(model.state_dict()) and pass --model-class"))


def _state_dict_of(obj):
    import torch

    if isinstance(obj, dict):
        for key in ("state_dict", "model_state_dict", "model"):
            if isinstance(obj.get(key), dict):
                obj = obj[key]
                break
        if obj and all(isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in obj.items()):
            return obj
    return None


def _load_state(module, state) -> tuple[list[str], list[str]]:
    result = module.load_state_dict(state, strict=False)
    return list(result.missing_keys), list(result.unexpected_keys)


def import_named(text: str, what: str) -> Any:
    """The object ``pkg.module:name`` names (the current folder is importable), or an error naming ``what``."""
    module_name, _, attr = text.partition(":")
    if str(Path.cwd()) not in sys.path:
        sys.path.insert(0, str(Path.cwd()))
    try:
        return getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError, ValueError) as exc:
        raise UsageError(f"cannot import {what} {text}: {exc}",
                         fix="name it as package.module:name, importable from the current folder or installed") from exc


def instantiate(model_class: str, model_args: str | dict | None):
    """Import ``pkg.module:Class`` (the current folder is importable) and build it with ``model_args``."""
    if ":" not in model_class:
        raise UsageError(f"--model-class {model_class!r} is not of the form pkg.module:Class",
                         fix="for example --model-class mypkg.models:ResNet")
    cls = import_named(model_class, "the model class")
    if isinstance(model_args, str):
        try:
            model_args = json.loads(model_args)
        except json.JSONDecodeError as exc:
            raise UsageError(f"--model-args is not valid JSON: {exc}", fix='for example --model-args \'{"num_classes": 10}\'') from exc
    kwargs = model_args or {}
    if not isinstance(kwargs, dict):
        raise UsageError("--model-args must be a JSON object of constructor keyword arguments",
                         fix='for example --model-args \'{"num_classes": 10}\'')
    try:
        return cls(**kwargs)
    except Exception as exc:  # noqa: BLE001 - user constructor
        raise UsageError(f"{model_class}(**{kwargs}) failed: {type(exc).__name__}: {exc}",
                         fix="check --model-args against the class's constructor") from exc


def _output_names(program) -> tuple[str, ...]:
    outs = program.graph_signature.user_outputs
    return tuple(f"output_{i}" if len(outs) > 1 else "output" for i in range(len(outs)))


def spec_from_exported(program) -> InputSpec:
    """The spec of an ExportedProgram: user inputs' fake shapes, symbols with their ranges."""
    import torch

    user = set(program.graph_signature.user_inputs)
    tensors, symbols = [], {}
    for node in program.graph.nodes:
        if node.op != "placeholder" or node.name not in user:
            continue
        val = node.meta.get("val")
        if not isinstance(val, torch.Tensor):
            raise InputSpecError(f"input {node.name} of the .pt2 is not a tensor", fix="pass --input to describe the inputs")
        shape = []
        for i, d in enumerate(val.shape):
            if isinstance(d, int):
                shape.append(d)
                continue
            expr = d.node.expr
            name = symbols.get(expr) or ("batch" if i == 0 else f"d{len(symbols)}")
            symbols[expr] = name
            shape.append(name)
        tensors.append(TensorSpec(node.name, dtype_name(val.dtype), tuple(shape)))
    dims = {}
    for expr, name in symbols.items():
        rng = program.range_constraints.get(expr)
        lo = max(1, int(rng.lower)) if rng is not None else 1
        hi = int(rng.upper) if rng is not None and rng.upper.is_finite else max(lo, 64)
        hi = min(hi, 4096)
        dims[name] = DimRange(lo, min(max(lo, 8), hi), hi)
    return InputSpec(tuple(tensors), dims)


ONNX_DTYPES = {1: "float32", 10: "float16", 16: "bfloat16", 11: "float64", 7: "int64", 6: "int32",
                5: "int16", 3: "int8", 2: "uint8", 9: "bool"}


def spec_from_onnx(model) -> InputSpec:
    initializers = {i.name for i in model.graph.initializer}
    tensors = []
    for value in model.graph.input:
        if value.name in initializers:
            continue
        kind = value.type.tensor_type
        shape = tuple(d.dim_param or d.dim_value or f"d{i}" for i, d in enumerate(kind.shape.dim))
        tensors.append(TensorSpec(value.name, ONNX_DTYPES.get(kind.elem_type, "float32"),
                                  tuple(s if isinstance(s, int) else s.replace("-", "_") for s in shape)))
    return InputSpec(tuple(tensors))


def check_against_onnx(spec: InputSpec, declared: InputSpec) -> None:
    """An ONNX model declares its inputs: the spec must name the same ones, of the same rank, dtype and fixed sizes."""
    if set(spec.names) != set(declared.names):
        raise InputSpecError(f"the ONNX model's inputs are {', '.join(declared.names)}, the spec names {', '.join(spec.names)}",
                             fix="use the model's own input names in --input")
    for given in spec.inputs:
        model = next(t for t in declared.inputs if t.name == given.name)
        fixed = [(a, b) for a, b in zip(given.shape, model.shape) if isinstance(a, int) and isinstance(b, int)]
        if len(given.shape) != len(model.shape) or given.dtype != model.dtype or any(a != b for a, b in fixed):
            raise InputSpecError(f"input {given.name} is {model} in the ONNX model (rank {len(model.shape)}), the spec "
                                 f"says {given} (rank {len(given.shape)})",
                                 fix=f"describe it as the model declares it, e.g. --input \"{model}\"")
