"""Triton settings from a latency-versus-batch curve; configs are parsed with Triton's own schema.

``tune`` is a pure function of the curve, so most tests feed it made-up curves of known shape; one
test measures a real ONNX model and checks only what must hold for any measurement.
"""

from __future__ import annotations

import pytest
from google.protobuf import text_format

from infopt.core.errors import UsageError
from infopt.core.inputspec import InputSpec
from infopt.exporters.servers.triton import config_pbtxt, max_batch_size, write_repository
from infopt.exporters.servers.triton_tuning import (
    DEFAULT_QUEUE_DELAY_US,
    MAX_QUEUE_DELAY_US,
    MIN_QUEUE_DELAY_US,
    QUEUE_DELAY_FRACTION,
    SATURATION_FRACTION,
    WARMUP_COUNT,
    Tuning,
    tune,
)
from infopt.report.performance import tuning_section
from tests.support.manifests import typed_manifest

model_config_pb2 = pytest.importorskip("tritonclient.grpc.model_config_pb2")
KIND_CPU = model_config_pb2.ModelInstanceGroup.KIND_CPU
KIND_GPU = model_config_pb2.ModelInstanceGroup.KIND_GPU

ENCODER = InputSpec.parse(["input_ids:int64[batch,seq]", "pixels:float32[batch,3,seq]"], ["batch=1:8:64", "seq=2:16:128"])
ENCODER_OUT = [("logits", "float32", ("batch", 2))]


def parse(text: str):
    return text_format.Parse(text, model_config_pb2.ModelConfig())


def curve(throughputs: dict[int, float], p50_scale: float = 1.0) -> list[dict]:
    """Curve points whose mean latency is batch / throughput, as the latency validator computes them."""
    points = []
    for batch, rate in throughputs.items():
        ms = batch / rate * 1e3
        points.append({"batch": batch, "p50_ms": ms * p50_scale, "p90_ms": ms * p50_scale * 1.1,
                       "p99_ms": ms * p50_scale * 1.3, "mean_ms": ms, "throughput": rate, "iterations": 50})
    return points


SATURATING = {1: 400.0, 2: 760.0, 4: 1400.0, 8: 2300.0, 16: 2900.0, 32: 3050.0, 64: 3100.0}


def test_saturating_curve_prefers_the_knee_and_the_best():
    points = curve(SATURATING)
    tuning = tune(points, "cuda", ENCODER, max_batch_size(ENCODER, ENCODER_OUT))
    # 16 is the smallest batch with >= 90% of 3100 samples/s; 64 is the best
    assert tuning.preferred_batch_sizes == [16, 64]
    assert tuning.instance_count == 1 and tuning.instance_kind == "KIND_GPU"  # 7.75x over batch 1: batches fill the GPU
    cfg = parse(config_pbtxt("enc", ENCODER, ENCODER_OUT, "cuda", tuning=tuning))
    assert cfg.max_batch_size == 64
    assert list(cfg.dynamic_batching.preferred_batch_size) == [16, 64]
    assert cfg.dynamic_batching.max_queue_delay_microseconds == tuning.max_queue_delay_us
    (group,) = cfg.instance_group
    assert group.count == 1 and group.kind == KIND_GPU
    assert "2900.0 samples/s" in tuning.reasons[0] and "3100.0 samples/s" in tuning.reasons[0]


def test_linear_scaling_prefers_the_largest_allowed_batch():
    points = curve({b: 100.0 * b for b in (1, 2, 4, 8, 16, 32, 64)})  # 64 was measured but is over max_batch
    tuning = tune(points, "cpu", ENCODER, 32)
    assert tuning.preferred_batch_sizes == [32]
    assert tuning.instance_count == 1 and tuning.instance_kind == "KIND_CPU"
    assert "6400" not in " ".join(tuning.reasons)


def test_flat_curve_on_gpu_gets_a_second_instance_and_no_wait():
    points = curve({1: 1000.0, 2: 1040.0, 4: 1060.0, 8: 1050.0})
    gpu = tune(points, "cuda", ENCODER, 64)
    assert gpu.preferred_batch_sizes == [] and gpu.max_queue_delay_us == 0
    assert gpu.instance_count == 2
    cfg = parse(config_pbtxt("enc", ENCODER, ENCODER_OUT, "cuda", tuning=gpu))
    assert cfg.HasField("dynamic_batching") and not cfg.dynamic_batching.preferred_batch_size
    assert cfg.dynamic_batching.max_queue_delay_microseconds == 0
    assert cfg.instance_group[0].count == 2 and cfg.instance_group[0].kind == KIND_GPU
    assert [w.batch_size for w in cfg.model_warmup] == [1]
    assert tune(points, "cpu", ENCODER, 64).instance_count == 1  # CPU: one instance uses every core already


def test_small_gain_on_gpu_keeps_batching_and_adds_an_instance():
    tuning = tune(curve({1: 100.0, 2: 120.0, 4: 130.0}), "cuda", ENCODER, 4)
    assert tuning.preferred_batch_sizes == [2, 4]  # 120 >= 0.9 * 130
    assert tuning.instance_count == 2  # 1.3x over batch 1
    assert "1.30x" in " ".join(tuning.reasons)


@pytest.mark.parametrize("p50_scale", [1.0, 1e-4, 1e3])
def test_queue_delay_is_a_fraction_of_the_knee_p50_within_bounds(p50_scale):
    points = curve(SATURATING, p50_scale)
    tuning = tune(points, "cpu", ENCODER, 64)
    knee = next(p for p in points if p["batch"] == tuning.preferred_batch_sizes[0])
    raw = QUEUE_DELAY_FRACTION * knee["p50_ms"] * 1e3
    assert tuning.max_queue_delay_us == min(max(round(raw), MIN_QUEUE_DELAY_US), MAX_QUEUE_DELAY_US)
    assert MIN_QUEUE_DELAY_US <= tuning.max_queue_delay_us <= MAX_QUEUE_DELAY_US
    delay_reason = next(r for r in tuning.reasons if r.startswith("max_queue_delay"))
    assert f"{knee['p50_ms']:.3f} ms" in delay_reason
    assert ("clamped" in delay_reason) == (p50_scale != 1.0)


def test_warmup_entries_parse_with_triton_schema():
    tuning = tune(curve(SATURATING), "cpu", ENCODER, 64)
    cfg = parse(config_pbtxt("enc", ENCODER, ENCODER_OUT, "cpu", tuning=tuning))
    assert [w.batch_size for w in cfg.model_warmup] == [16, 64]
    for warmup in cfg.model_warmup:
        assert warmup.count == WARMUP_COUNT and warmup.name
        ids, pixels = warmup.inputs["input_ids"], warmup.inputs["pixels"]
        assert list(ids.dims) == [16] and list(pixels.dims) == [3, 16]  # no batch dim; seq at its opt
        assert ids.data_type == model_config_pb2.TYPE_INT64 and ids.WhichOneof("input_data_type") == "zero_data"
        assert pixels.data_type == model_config_pb2.TYPE_FP32 and pixels.WhichOneof("input_data_type") == "random_data"


def test_integer_and_bool_inputs_get_zero_data():
    spec = InputSpec.parse(["ids:int32[batch,8]", "mask:bool[batch,8]", "img:uint8[batch,4]", "x:float16[batch,8]"])
    tuning = tune(curve(SATURATING), "cpu", spec, 64)
    (first, *_) = parse(config_pbtxt("m", spec, [("y", "float32", ("batch", 2))], "cpu", tuning=tuning)).model_warmup
    fills = {name: tensor.WhichOneof("input_data_type") for name, tensor in first.inputs.items()}
    assert fills == {"ids": "zero_data", "mask": "zero_data", "img": "zero_data", "x": "random_data"}


def test_no_batch_dim_means_no_batching_and_whole_shape_warmup():
    spec = InputSpec.parse(["x:float32[4,seq]"], ["seq=2:8:16"])
    outputs = [("y", "float32", (4, "seq"))]
    assert max_batch_size(spec, outputs) == 0
    tuning = tune(curve(SATURATING), "cuda", spec, 0)
    assert not tuning.dynamic_batching and tuning.instance_count == 1 and tuning.preferred_batch_sizes == []
    assert any("no batch dim" in r for r in tuning.reasons)
    cfg = parse(config_pbtxt("m", spec, outputs, "cuda", tuning=tuning))
    assert cfg.max_batch_size == 0 and not cfg.HasField("dynamic_batching")
    (warmup,) = cfg.model_warmup
    assert warmup.batch_size == 1 and list(warmup.inputs["x"].dims) == [4, 8]


def test_output_without_batch_dim_warms_up_the_whole_shape():
    spec = InputSpec.parse(["x:float32[batch,3]"], ["batch=1:4:8"])
    outputs = [("y", "float32", (3,))]
    tuning = tune(curve(SATURATING), "cpu", spec, max_batch_size(spec, outputs))
    (warmup,) = parse(config_pbtxt("m", spec, outputs, "cpu", tuning=tuning)).model_warmup
    assert warmup.batch_size == 1 and list(warmup.inputs["x"].dims) == [4, 3]  # batch at its opt, inside the shape


@pytest.mark.parametrize("curve, on_target, why", [([], True, "no latency was measured"),
                                                    (None, False, "another kind of device")])
def test_without_a_curve_from_the_target_the_batcher_keeps_its_defaults(curve, on_target, why):
    spec = InputSpec.parse(["x:float32[batch,3]"], ["batch=2:4:8"])
    measured = [{"batch": b, "p50_ms": 1.0, "p90_ms": 1.0, "p99_ms": 1.0, "mean_ms": 1.0, "throughput": 1000.0 * b,
                 "iterations": 20} for b in (2, 4, 8)]
    tuning = tune(measured if curve is None else curve, "cuda", spec, 8, measured_on_target=on_target)
    assert tuning.dynamic_batching and tuning.instance_count == 1
    assert tuning.preferred_batch_sizes == [4, 8] and tuning.max_queue_delay_us == DEFAULT_QUEUE_DELAY_US
    assert any(why in r for r in tuning.reasons)
    cfg = parse(config_pbtxt("m", spec, [("y", "float32", ("batch", 3))], "cuda", tuning=tuning))
    assert cfg.max_batch_size == 8 and list(cfg.dynamic_batching.preferred_batch_size) == [4, 8]
    assert [w.batch_size for w in cfg.model_warmup] == [4, 8] and list(cfg.model_warmup[0].inputs["x"].dims) == [3]


def test_mismatched_tuning_is_a_usage_error(tmp_path):
    spec = InputSpec.parse(["x:float32[batch,3]"], ["batch=1:4:8"])
    outputs = [("y", "float32", ("batch", 3))]
    cpu = tune(curve({1: 10.0, 2: 20.0, 4: 40.0, 8: 80.0}), "cpu", spec, 8)
    plan = tmp_path / "m.plan"
    plan.write_bytes(b"engine")
    with pytest.raises(UsageError, match="KIND_CPU"):  # an engine runs on a GPU
        write_repository(tmp_path / "repo", "m", plan, spec, outputs, "cpu", tuning=cpu)
    with pytest.raises(UsageError, match="max_batch_size"):
        config_pbtxt("m", spec, [("y", "float32", (3,))], "cpu", tuning=cpu)
    with pytest.raises(UsageError):
        tune([], "cpu", InputSpec.parse(["x:float32[4,3]"]), 8)


def test_write_repository_with_tuning(tmp_path):
    spec = InputSpec.parse(["x:float32[batch,6]"], ["batch=1:4:16"])
    package = tmp_path / "model.pt2"
    package.write_bytes(b"pt2")
    tuning = tune(curve({1: 100.0, 2: 200.0, 4: 390.0, 8: 700.0, 16: 760.0}), "cuda", spec, 16)
    folder = write_repository(tmp_path / "repo", "lin", package, spec, [("y", "float32", ("batch", 3))], "cuda",
                              tuning=tuning)
    cfg = parse((folder / "config.pbtxt").read_text())
    assert cfg.backend == "python"
    assert list(cfg.dynamic_batching.preferred_batch_size) == tuning.preferred_batch_sizes == [8, 16]
    assert [w.batch_size for w in cfg.model_warmup] == [8, 16]
    assert list(cfg.model_warmup[0].inputs["x"].dims) == [6]


def test_tuning_section_renders_the_curve_and_reasons():
    points = curve(SATURATING)
    tuning = tune(points, "cuda", ENCODER, 64)
    manifest = typed_manifest(triton_tuning=tuning.to_json(), validation={"curve": points, "device": "a test GPU"})
    assert Tuning.from_json(manifest.triton_tuning) == tuning
    section = tuning_section(manifest)
    assert section is not None and len(section.rows) == len(points)
    assert section.headers[4] == "vs batch 1"
    by_batch = {row[0]: row for row in section.rows}
    assert by_batch["1"][4] == "1.00x" and by_batch["64"][4] == "7.75x"
    assert [row[0] for row in section.rows if row[5] == "yes"] == ["16", "64"]
    assert set(tuning.reasons) <= set(section.notes)
    assert any("a test GPU" in n for n in section.notes)
    assert tuning_section(typed_manifest(validation={"curve": points})) is None


def test_tuning_from_a_measured_curve(tmp_path):
    """A real ONNX model timed with the latency validator: only properties every measurement has."""
    torch = pytest.importorskip("torch")
    ort = pytest.importorskip("onnxruntime")
    import numpy as np
    from torch.export import Dim

    from infopt.validators.timing import measure

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256), torch.nn.ReLU(),
                                torch.nn.Linear(256, 10)).eval()
    path = tmp_path / "mlp.onnx"
    program = torch.onnx.export(model, (torch.randn(4, 64),), dynamo=True, verbose=False, input_names=["x"], output_names=["y"],
                                dynamic_shapes=({0: Dim("batch", min=1, max=32)},))
    program.save(str(path))
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    batches = [1, 2, 4, 8, 16, 32]
    rng = np.random.default_rng(0)
    feeds = {b: {"x": rng.standard_normal((b, 64), dtype=np.float32)} for b in batches}
    stats = measure({"ort": lambda feed: session.run(None, feed)}, feeds, warmup=3, iterations=20).stats
    measured = [{k: v for k, v in s.to_json().items() if k != "runner"} for s in stats]

    spec = InputSpec.parse(["x:float32[batch,64]"], ["batch=1:8:32"])
    outputs = [("y", "float32", ("batch", 10))]
    tuning = tune(measured, "cpu", spec, max_batch_size(spec, outputs))
    rate = {p["batch"]: p["throughput"] for p in measured}
    best = max(rate, key=rate.__getitem__)
    preferred = tuning.preferred_batch_sizes
    assert preferred == sorted(set(preferred)) and set(preferred) <= set(batches)
    assert tuning.instance_count == 1 and tuning.instance_kind == "KIND_CPU"
    text = " ".join(tuning.reasons)
    assert f"{rate[best]:.1f} samples/s" in text
    if preferred:
        knee = preferred[0]
        assert preferred[-1] == best
        assert rate[knee] >= SATURATION_FRACTION * rate[best]
        assert all(rate[b] < SATURATION_FRACTION * rate[best] for b in batches if b < knee)
        assert MIN_QUEUE_DELAY_US <= tuning.max_queue_delay_us <= MAX_QUEUE_DELAY_US
        assert f"{next(p['p50_ms'] for p in measured if p['batch'] == knee):.3f} ms" in text
    else:
        assert rate[1] >= SATURATION_FRACTION * rate[best] and tuning.max_queue_delay_us == 0
    cfg = parse(config_pbtxt("mlp", spec, outputs, "cpu", tuning=tuning))
    assert list(cfg.dynamic_batching.preferred_batch_size) == preferred
    assert [w.batch_size for w in cfg.model_warmup] == (preferred or [1])
    assert all(list(w.inputs["x"].dims) == [64] for w in cfg.model_warmup)

