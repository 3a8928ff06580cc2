"""KServe ``InferenceService`` manifests for a build: ``servers/kserve/inferenceservice.yaml``.

One multi-document YAML file, ``apiVersion: serving.kserve.io/v1beta1``, ``kind: InferenceService``,
in the form KServe documents for its model-serving runtimes: ``spec.predictor.model`` with
``modelFormat``, ``runtime``, ``protocolVersion: v2`` (the Open Inference Protocol) and
``storageUri``. For an ONNX model there are two documents serving the same files; apply one:

- ``<name>-triton``: ``modelFormat: triton``, runtime ``kserve-tritonserver``. It serves the Triton
  model repository the build wrote at ``servers/triton/`` exactly as configured there
  (``config.pbtxt``): ONNX through Triton's ONNX Runtime backend (with the TensorRT execution
  accelerator when the build asked for a server-built engine), a TensorRT plan through the
  TensorRT backend, an AOTInductor package through the Python backend. Written for every build.
- ``<name>-onnx``: ``modelFormat: onnx``, runtime ``kserve-tritonserver``, only for an ONNX model.

What runs the ONNX model: KServe has no stand-alone ONNX Runtime server. Its old
``spec.predictor.onnx`` field is rewritten by KServe's defaulting webhook into ``modelFormat: onnx``
with protocol v2, and the runtime KServe installs for ``onnx`` is ``kserve-tritonserver``: Triton,
whose ``onnxruntime`` backend is ONNX Runtime. KServe's repository also carries ``kserve-openvino``
(``config/runtimes/``, since 0.17, outside the default install set): OpenVINO Model Server, which runs
ONNX with OpenVINO rather than ONNX Runtime, expects ``<storage>/1/model.onnx`` rather than Triton's
``<storage>/<model>/1/model.onnx``, and lists ``onnx`` at priority 2 against Triton's 1, so where it
is installed auto-select sends ``onnx`` there. Both documents therefore name their runtime. The ONNX
document is ONNX Runtime inside Triton, on the same repository and ``config.pbtxt`` as the Triton
one: it declares the model's format rather than the repository's, the form KServe's ONNX guide
shows, and it is the one to edit (``runtime``) for a cluster with its own ONNX ``ServingRuntime``
that reads the Triton layout. Neither can point at ``model/model.onnx``: KServe downloads
``storageUri`` to ``/mnt/models`` and starts Triton with ``--model-store=/mnt/models``, which needs
``<model>/<version>/`` folders. ``modelFormat`` carries no ``version``: KServe matches
``<format>:<version>`` exactly against the versions a runtime lists, and a bare name matches any.

``storageUri``: where the user uploads ``dist/<name>/servers/triton/`` (the folder holding
``<name>/config.pbtxt``), e.g. ``aws s3 cp --recursive dist/<name>/servers/triton
s3://my-bucket/<name>/servers/triton``. Without one the manifest carries the placeholder
``s3://YOUR-BUCKET/<name>/servers/triton``, which the user replaces. Requests then go to
``/v2/models/<name>/infer`` on the service, ``<name>`` being the Triton model (the build's name).

Caveats the manifest cannot fix: a TensorRT plan loads only in a Triton image with the TensorRT
version that built it, and an AOTInductor package only where the Python backend has the torch build
that compiled it (stock Triton images have no torch). The image is chosen with
``spec.predictor.model.runtimeVersion`` (the ``nvcr.io/nvidia/tritonserver`` tag; KServe's default
is old, ``23.05-py3`` in its kustomization) or a custom ``ServingRuntime``.

Names: KServe requires an InferenceService name to match ``[a-z]([-a-z0-9]*[a-z0-9])?``
(``IsvcNameFmt`` in ``inference_service_validation.go``); names are lowercased, other characters become
``-``, and the whole is kept to 47 characters so Knative's revision ``<name>-predictor-00001`` is a
valid 63-character DNS label.

Resources are starting points, not measurements: one CPU requested (two allowed), memory 2 GiB plus
twice the model file (the server holds the file and the runtime's copy while it loads), 2 GiB more
for an AOTInductor package (torch in the Python backend), rounded up to whole GiB and with
``limits.memory == requests.memory``; ``nvidia.com/gpu: 1`` in ``limits`` when the target device is
``cuda`` or the model is a TensorRT plan.
"""

from __future__ import annotations

import hashlib
import math
import re
from pathlib import Path, PurePosixPath
from typing import Any

import yaml

from infopt.core.errors import UsageError
from infopt.core.manifest_schema import Manifest
from infopt.exporters.servers.emitter import EmitJob, ServerEmitter, register

API_VERSION = "serving.kserve.io/v1beta1"
KIND = "InferenceService"
TRITON_RUNTIME = "kserve-tritonserver"
PROTOCOL = "v2"
MANIFEST_FILE = "inferenceservice.yaml"
PLACEHOLDER_BUCKET = "s3://YOUR-BUCKET"
LABEL_PREFIX = "infopt"
MAX_NAME = 47
"""Longest InferenceService name whose Knative revision ``<name>-predictor-00001`` fits 63 characters."""
GIB = 2**30


def service_name(model_name: str, suffix: str = "") -> str:
    """A valid InferenceService name (a DNS-1035 label, at most ``MAX_NAME`` characters) for a model.

    ``My_Model.v2`` gives ``my-model-v2``; a name that does not start with a letter gets ``model-``
    in front; a name cut to fit ends with six hex digits of the original's sha256, so two long names
    that share a prefix stay distinct."""
    base = re.sub(r"[^a-z0-9]+", "-", model_name.lower()).strip("-")
    if not base:
        raise UsageError(f"cannot derive a KServe InferenceService name from {model_name!r}",
                         fix="give the build a name with at least one letter or digit (--name)")
    if not base[0].isalpha():
        base = f"model-{base}"
    room = MAX_NAME - len(suffix)
    if len(base) > room:
        digest = hashlib.sha256(model_name.encode()).hexdigest()[:6]
        base = f"{base[:room - 7].rstrip('-')}-{digest}"
    return base + suffix


def label_value(text: str) -> str:
    """``text`` as a Kubernetes label value: at most 63 of ``[-A-Za-z0-9_.]``, alphanumeric at both ends."""
    value = re.sub(r"[^-A-Za-z0-9_.]+", "-", text)[:63]
    return re.sub(r"^[^A-Za-z0-9]+|[^A-Za-z0-9]+$", "", value)


def _memory(model_bytes: int | None, suffix: str) -> str:
    extra = 2 * GIB if suffix == ".pt2" else 0
    return f"{math.ceil((2 * GIB + 2 * (model_bytes or 0) + extra) / GIB)}Gi"


def resources(manifest: Manifest) -> dict[str, dict[str, str]]:
    """``requests``/``limits`` for the predictor container (see the module docstring for the rule)."""
    model = manifest.artifacts.model
    suffix = PurePosixPath(model).suffix
    entry = manifest.files.get(model)
    memory = _memory(entry.bytes if entry else None, suffix)
    limits = {"cpu": "2", "memory": memory}
    if manifest.target.device == "cuda" or suffix == ".plan":
        limits["nvidia.com/gpu"] = "1"
    return {"requests": {"cpu": "1", "memory": memory}, "limits": limits}


def default_storage_uri(manifest: Manifest) -> str:
    """The placeholder ``s3://YOUR-BUCKET/<name>/servers/triton`` that the user replaces."""
    return f"{PLACEHOLDER_BUCKET}/{manifest.name}/{_repository_root(manifest)}"


def _repository_root(manifest: Manifest) -> str:
    triton = manifest.artifacts.get("triton")
    if not triton:
        raise UsageError(f"build {manifest.name!r} has no Triton model repository for KServe to serve",
                         where="manifest.json: artifacts.triton",
                         fix="emit triton as well as kserve (KServe's Triton runtime serves servers/triton/)")
    return PurePosixPath(triton).parent.as_posix()


def _metadata(name: str, manifest: Manifest, predictor: str) -> dict[str, Any]:
    recipe = str(manifest.recipe.get("name", ""))
    labels = {"app.kubernetes.io/name": label_value(manifest.name), f"{LABEL_PREFIX}/predictor": predictor}
    if recipe:
        labels[f"{LABEL_PREFIX}/recipe"] = label_value(recipe)
    annotations = {f"{LABEL_PREFIX}/manifest-name": manifest.name,
                   f"{LABEL_PREFIX}/recipe": recipe,
                   f"{LABEL_PREFIX}/target": manifest.target.name,
                   f"{LABEL_PREFIX}/model-file": manifest.artifacts.model,
                   f"{LABEL_PREFIX}/precision": manifest.precision}
    return {"name": name, "labels": {k: v for k, v in labels.items() if v}, "annotations": annotations}


def _service(name: str, manifest: Manifest, model_format: str, storage_uri: str) -> dict[str, Any]:
    model = {"modelFormat": {"name": model_format},
             "runtime": TRITON_RUNTIME,
             "protocolVersion": PROTOCOL,
             "storageUri": storage_uri,
             "resources": resources(manifest)}
    return {"apiVersion": API_VERSION, "kind": KIND, "metadata": _metadata(name, manifest, model_format),
            "spec": {"predictor": {"model": model}}}


def inference_services(name: str, manifest: Manifest, storage_uri: str | None = None) -> list[dict[str, Any]]:
    """The InferenceService objects for a build: the Triton one, then the ONNX one for an ONNX model.

    ``name`` is the model's name (``My_Model`` is fine; it is made a valid service name);
    ``manifest`` is the build's manifest; ``storage_uri`` is where ``servers/triton/`` is uploaded,
    the placeholder from ``default_storage_uri`` when not given."""
    suffix = PurePosixPath(manifest.artifacts.model).suffix
    if suffix not in (".onnx", ".plan", ".pt2"):
        raise UsageError(f"KServe manifests cover ONNX, TensorRT and AOTInductor models, not {manifest.artifacts.model}",
                         where="manifest.json: artifacts.model", fix="build an .onnx, .plan or .pt2 model")
    _repository_root(manifest)
    uri = storage_uri if storage_uri is not None else default_storage_uri(manifest)
    if "://" not in uri:
        raise UsageError(f"KServe storage URI {uri!r} has no scheme",
                         fix="give a URI such as s3://bucket/path, gs://bucket/path or pvc://claim/path")
    services = [_service(service_name(name, "-triton"), manifest, "triton", uri)]
    if suffix == ".onnx":
        services.append(_service(service_name(name, "-onnx"), manifest, "onnx", uri))
    return services


def _header(manifest: Manifest, services: list[dict[str, Any]]) -> str:
    name = manifest.name
    root = _repository_root(manifest)
    uri = services[0]["spec"]["predictor"]["model"]["storageUri"]
    lines = [f"KServe InferenceServices for {name} (written by infopt): "
             + ", ".join(s["metadata"]["name"] for s in services) + ".",
             f"storageUri must hold the build's {root}/ folder (the Triton model repository), e.g.:"]
    if uri.startswith("s3://"):
        lines.append(f"  aws s3 cp --recursive dist/{name}/{root} {uri}")
    elif uri.startswith("gs://"):
        lines.append(f"  gcloud storage cp --recursive dist/{name}/{root}/* {uri}/")
    else:
        lines.append(f"  copy dist/{name}/{root}/ to {uri}")
    if PLACEHOLDER_BUCKET in uri:
        lines.append(f"Replace {PLACEHOLDER_BUCKET} with your bucket before applying.")
    lines.append(f"Requests: POST <service URL>/v2/models/{PurePosixPath(str(manifest.artifacts.get('triton'))).name}/infer"
                 " (Open Inference Protocol).")
    if len(services) > 1:
        lines.append("Both run in kserve-tritonserver, the ONNX one through Triton's ONNX Runtime backend; apply one.")
    suffix = PurePosixPath(manifest.artifacts.model).suffix
    if suffix == ".plan":
        lines.append("The TensorRT plan needs a Triton image with the TensorRT that built it (set runtimeVersion).")
    if suffix == ".pt2":
        lines.append("The AOTInductor package needs a Triton image whose Python backend has the torch that compiled it.")
    return "".join(f"# {line}\n" for line in lines)


def write_kserve(folder: Path, name: str, manifest: Manifest, storage_uri: str | None = None) -> Path:
    """Write ``folder/inferenceservice.yaml`` (``folder`` is ``<dist>/servers/kserve``); returns its path."""
    services = inference_services(name, manifest, storage_uri)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / MANIFEST_FILE
    body = yaml.safe_dump_all(services, sort_keys=False, default_flow_style=False, explicit_start=True)
    path.write_text(_header(manifest, services) + body)
    return path


def emit(job: EmitJob) -> Path | None:
    """InferenceServices over the Triton repository written before it; nothing without one."""
    if "triton" not in job.manifest.artifacts:
        return None
    return write_kserve(job.stage / "servers" / "kserve", job.name, job.manifest)


SERVES = {
    "onnx": "through the Triton model repository written before it",
    "aoti": "through the Triton model repository written before it",
    "tensorrt": "through the Triton model repository written before it",
}
"""the representations this server serves, and how"""

EMITTER = register(ServerEmitter("kserve", 30, emit, SERVES))
