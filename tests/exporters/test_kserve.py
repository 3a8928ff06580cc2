"""The KServe manifests are read back with KServe's own Python SDK model classes.

``kserve.ApiClient`` turns the YAML's documents into ``V1beta1InferenceService`` objects, with
``metadata`` and ``resources`` as the Kubernetes client's ``V1ObjectMeta`` and
``V1ResourceRequirements``. The generated classes drop keys they do not know and coerce primitives
(``str(2)``), so each object is serialized again and compared with the document: a misspelled field
or a wrong type shows up as a difference. The tests that need the SDK skip when it is absent.

Installing the SDK: every released ``kserve`` caps protobuf below 7 (and the older ones numpy below
2), so it goes in with ``pip install --no-deps kserve==0.21.0`` beside ``kubernetes`` and ``six``.
Without its server dependencies ``import kserve`` fails (its ``__init__`` imports the model-server
stack: fastapi, cloudevents, grpc), so the fixture below loads only the generated client code,
``kserve.models`` and ``kserve.api_client``, which need six, python-dateutil, urllib3 and certifi;
``kubernetes`` supplies ``V1ObjectMeta`` and ``V1ResourceRequirements``.
"""

from __future__ import annotations

import copy
import importlib
import importlib.util
import json
import re
import sys
import types
from typing import Any

import pytest
import yaml

from infopt.core.errors import UsageError
from infopt.core.manifest_schema import Manifest
from infopt.exporters.servers.kserve import MAX_NAME, inference_services, service_name, write_kserve
from tests.support.manifests import typed_manifest

# KServe's InferenceService name rule (IsvcNameFmt, pkg/apis/serving/v1beta1/inference_service_validation.go)
ISVC_NAME = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
# Kubernetes label values (apimachinery validation.IsValidLabelValue)
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")


def make_manifest(name: str = "digits_cnn", suffix: str = ".onnx", device: str = "cpu", *,
                  triton: bool = True, model_bytes: int = 41_557) -> Manifest:
    """A build manifest with the fields the KServe exporter reads set for the test."""
    model = f"model/model{suffix}"
    artifacts = {"model": model}
    if triton:
        artifacts["triton"] = f"servers/triton/{name}"
    return typed_manifest(name=name, precision="fp16" if device == "cuda" else "fp32",
                          target={"name": "h100" if device == "cuda" else "cpu", "device": device},
                          recipe={"name": "fp16-tensorrt" if device == "cuda" else "fp32-onnxruntime"},
                          artifacts=artifacts, files={model: {"bytes": model_bytes, "sha256": "0" * 64}})


def model_of(service: dict[str, Any]) -> dict[str, Any]:
    return service["spec"]["predictor"]["model"]


# --- the manifests themselves ------------------------------------------------------------------


def test_onnx_build_gets_triton_and_onnx_predictors():
    services = inference_services("digits_cnn", make_manifest())
    assert [s["metadata"]["name"] for s in services] == ["digits-cnn-triton", "digits-cnn-onnx"]
    assert [model_of(s)["modelFormat"] for s in services] == [{"name": "triton"}, {"name": "onnx"}]
    for service in services:
        assert service["apiVersion"] == "serving.kserve.io/v1beta1" and service["kind"] == "InferenceService"
        model = model_of(service)
        assert model["runtime"] == "kserve-tritonserver"  # named: auto-select may pick OpenVINO for onnx
        assert model["protocolVersion"] == "v2"
        assert model["storageUri"] == "s3://YOUR-BUCKET/digits_cnn/servers/triton"
        assert "nvidia.com/gpu" not in model["resources"]["limits"]
        assert "nvidia.com/gpu" not in model["resources"]["requests"]
        assert model["resources"]["requests"]["cpu"] == "1"
        assert model["resources"]["requests"]["memory"] == model["resources"]["limits"]["memory"] == "3Gi"
        meta = service["metadata"]
        assert meta["labels"]["app.kubernetes.io/name"] == "digits_cnn"
        assert meta["labels"]["infopt/recipe"] == "fp32-onnxruntime"
        assert meta["annotations"]["infopt/manifest-name"] == "digits_cnn"
        assert meta["annotations"]["infopt/recipe"] == "fp32-onnxruntime"
        assert meta["annotations"]["infopt/model-file"] == "model/model.onnx"
        assert all(LABEL_VALUE.match(v) and len(v) <= 63 for v in meta["labels"].values())
    assert [s["metadata"]["labels"]["infopt/predictor"] for s in services] == ["triton", "onnx"]


@pytest.mark.parametrize("suffix", [".pt2", ".plan"])
def test_non_onnx_model_gets_only_the_triton_predictor(suffix):
    (service,) = inference_services("enc", make_manifest("enc", suffix))
    assert service["metadata"]["name"] == "enc-triton"
    assert model_of(service)["modelFormat"] == {"name": "triton"}
    assert model_of(service)["storageUri"] == "s3://YOUR-BUCKET/enc/servers/triton"


def test_cuda_target_asks_for_one_gpu():
    for service in inference_services("enc", make_manifest("enc", ".onnx", "cuda")):
        limits = model_of(service)["resources"]["limits"]
        assert limits["nvidia.com/gpu"] == "1"
        assert service["metadata"]["annotations"]["infopt/target"] == "h100"


def test_tensorrt_plan_asks_for_a_gpu_even_from_a_cpu_manifest():
    (service,) = inference_services("enc", make_manifest("enc", ".plan", "cpu"))
    assert model_of(service)["resources"]["limits"]["nvidia.com/gpu"] == "1"


def test_memory_grows_with_the_model_and_for_the_python_backend():
    def memory(suffix: str, size: int) -> str:
        (service, *_) = inference_services("m", make_manifest("m", suffix, model_bytes=size))
        return model_of(service)["resources"]["requests"]["memory"]

    assert memory(".onnx", 0) == "2Gi"
    assert memory(".onnx", 3 * 2**30) == "8Gi"  # 2 GiB + 2 x 3 GiB
    assert memory(".pt2", 0) == "4Gi"  # torch in Triton's Python backend


@pytest.mark.parametrize("model_name, expected", [
    ("My_Model.V2", "my-model-v2-triton"),
    ("ResNet50__FP16", "resnet50-fp16-triton"),
    ("3d_unet", "model-3d-unet-triton"),
    ("__bert--base__", "bert-base-triton"),
])
def test_service_name_is_a_valid_kserve_name(model_name, expected):
    (service, *_) = inference_services(model_name, make_manifest(model_name))
    assert service["metadata"]["name"] == expected
    assert ISVC_NAME.match(expected)


def test_long_names_are_cut_to_fit_and_stay_distinct():
    first, second = "A" * 80 + "_one", "A" * 80 + "_two"
    names = {service_name(first, "-triton"), service_name(second, "-triton"), service_name(first, "-onnx")}
    assert len(names) == 3
    for name in names:
        assert ISVC_NAME.match(name) and len(name) <= MAX_NAME
        assert len(f"{name}-predictor-00001") <= 63  # the Knative revision is a DNS label too


def test_unusable_inputs_are_usage_errors():
    with pytest.raises(UsageError, match="InferenceService name"):
        service_name("___")
    with pytest.raises(UsageError, match="no Triton model repository"):
        inference_services("m", make_manifest("m", triton=False))
    with pytest.raises(UsageError, match="no scheme"):
        inference_services("m", make_manifest("m"), storage_uri="my-bucket/m")
    bad = make_manifest("m")
    bad.artifacts.model = "model/model.pt"
    with pytest.raises(UsageError, match="not model/model.pt"):
        inference_services("m", bad)


def test_given_storage_uri_is_used_by_every_predictor():
    uri = "gs://models/digits/servers/triton"
    services = inference_services("digits_cnn", make_manifest(), storage_uri=uri)
    assert [model_of(s)["storageUri"] for s in services] == [uri, uri]


def test_write_kserve_writes_the_documents(tmp_path):
    manifest = make_manifest()
    path = write_kserve(tmp_path / "servers" / "kserve", "digits_cnn", manifest)
    assert path == tmp_path / "servers" / "kserve" / "inferenceservice.yaml"
    text = path.read_text()
    assert list(yaml.safe_load_all(text)) == inference_services("digits_cnn", manifest)
    header = text.split("---", 1)[0]
    assert "dist/digits_cnn/servers/triton" in header and "Replace s3://YOUR-BUCKET" in header
    assert "/v2/models/digits_cnn/infer" in header
    custom = write_kserve(tmp_path / "other", "digits_cnn", manifest, storage_uri="pvc://models/triton")
    assert "YOUR-BUCKET" not in custom.read_text()


# --- read back with the KServe SDK -------------------------------------------------------------


@pytest.fixture(scope="module")
def sdk():
    """``(kserve.models, a deserializing client)``; k8s types go to the Kubernetes client's classes.

    ``kserve.ApiClient`` resolves every class name in ``kserve.models``, which has no ``V1ObjectMeta``,
    and reads ``list[...]``/``dict(...)`` but not the ``List[...]``/``Dict[...]`` of recent
    Kubernetes clients; the subclass hands those names to ``kubernetes.client.ApiClient``."""
    k8s = pytest.importorskip("kubernetes.client")
    spec = importlib.util.find_spec("kserve")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("kserve SDK not installed: pip install --no-deps kserve==0.21.0 (plus kubernetes, six)")
    saved = {k: v for k, v in sys.modules.items() if k == "kserve" or k.startswith("kserve.")}
    if "kserve" not in sys.modules:  # a package object without running kserve/__init__.py
        package = types.ModuleType("kserve")
        package.__path__ = list(spec.submodule_search_locations)
        package.__spec__ = spec
        sys.modules["kserve"] = package
    models = importlib.import_module("kserve.models")
    api_client = importlib.import_module("kserve.api_client")
    k8s_client = k8s.ApiClient()

    class Client(api_client.ApiClient):
        def _ApiClient__deserialize(self, data, klass):
            if isinstance(klass, str) and not hasattr(models, klass) and hasattr(k8s.models, klass):
                return k8s_client._ApiClient__deserialize(data, klass)
            return super()._ApiClient__deserialize(data, klass)

    yield models, Client()
    for key in [k for k in sys.modules if k == "kserve" or k.startswith("kserve.")]:
        del sys.modules[key]
    sys.modules.update(saved)


class Response:
    """What ``ApiClient.deserialize`` reads: a body in ``.data``."""

    def __init__(self, document: dict[str, Any]):
        self.data = json.dumps(document)


def differences(left: Any, right: Any, path: str = "") -> list[str]:
    """The paths of ``left`` that ``right`` lacks or holds with another value or type.

    Keys only ``right`` has are not differences: the SDK fills in its defaults (``V1beta1ModelSpec``
    gives the container ``name: ''``, which KServe's defaulter replaces with ``kserve-container``)."""
    if isinstance(left, dict) and isinstance(right, dict):
        found = []
        for key in sorted(left):
            where = f"{path}.{key}" if path else key
            if key not in right:
                found.append(f"{where}: dropped")
            else:
                found += differences(left[key], right[key], where)
        return found
    if isinstance(left, list) and isinstance(right, list) and len(left) == len(right):
        return [d for i, (a, b) in enumerate(zip(left, right, strict=True)) for d in differences(a, b, f"{path}[{i}]")]
    return [] if type(left) is type(right) and left == right else [f"{path}: {left!r} != {right!r}"]


def round_trip(sdk, document: dict[str, Any]) -> tuple[Any, list[str]]:
    """The SDK object for ``document`` and what serializing it again lost or changed."""
    models, client = sdk
    obj = client.deserialize(Response(document), "V1beta1InferenceService")
    return obj, differences(document, client.sanitize_for_serialization(obj))


BUILDS = [("digits_cnn", ".onnx", "cpu"), ("Enc_Model", ".onnx", "cuda"), ("pkg", ".pt2", "cuda"), ("eng", ".plan", "cuda")]


@pytest.mark.parametrize("name, suffix, device", BUILDS)
def test_sdk_reads_every_field_back(sdk, tmp_path, name, suffix, device):
    models, _ = sdk
    k8s_models = importlib.import_module("kubernetes.client.models")
    manifest = make_manifest(name, suffix, device)
    path = write_kserve(tmp_path, name, manifest)
    documents = list(yaml.safe_load_all(path.read_text()))
    assert len(documents) == (2 if suffix == ".onnx" else 1)
    for document in documents:
        obj, lost = round_trip(sdk, document)
        assert lost == []
        assert isinstance(obj, models.V1beta1InferenceService)
        assert isinstance(obj.metadata, k8s_models.V1ObjectMeta)
        assert ISVC_NAME.match(obj.metadata.name)
        assert obj.metadata.annotations["infopt/manifest-name"] == name
        model = obj.spec.predictor.model
        assert isinstance(model, models.V1beta1ModelSpec)
        assert isinstance(model.model_format, models.V1beta1ModelFormat)
        assert model.model_format.name in ("triton", "onnx")
        assert model.runtime == "kserve-tritonserver"
        assert model.protocol_version == "v2"
        assert model.storage_uri == f"s3://YOUR-BUCKET/{name}/servers/triton"
        assert isinstance(model.resources, k8s_models.V1ResourceRequirements)
        assert (model.resources.limits.get("nvidia.com/gpu") == "1") == (device == "cuda")


@pytest.mark.parametrize("mangle, expected", [
    (lambda d: d["spec"]["predictor"]["model"].update(storageURI=d["spec"]["predictor"]["model"].pop("storageUri")),
     "spec.predictor.model.storageURI: dropped"),
    (lambda d: d["spec"]["predictor"].update(modle=d["spec"]["predictor"].pop("model")),
     "spec.predictor.modle: dropped"),
    (lambda d: d["metadata"].update(label=d["metadata"].pop("labels")),
     "metadata.label: dropped"),
    (lambda d: d["spec"]["predictor"]["model"].update(protocolVersion=2),
     "spec.predictor.model.protocolVersion: 2 != '2'"),
])
def test_round_trip_catches_misspelled_fields_and_wrong_types(sdk, mangle, expected):
    document = inference_services("digits_cnn", make_manifest())[0]
    assert round_trip(sdk, document)[1] == []
    broken = copy.deepcopy(document)
    mangle(broken)
    assert expected in round_trip(sdk, broken)[1]
