"""transformers' own architectures, as a user brings them: a folder written by ``save_pretrained``
(config.json and safetensors, tiny random configs), built from the command line in the folder that
holds it, with a relative path.

This is the first slice of the zoo: the families whose default ONNX Runtime build failed before
(Llama, Qwen2 and Mistral on ONNX Runtime's RMSNorm op that onnx's checker does not know, GPT-2 on a
fusion ONNX Runtime refused, BERT-family ``--int8`` on bias initializers the exporter shares). Each
cell asserts exit 0, every candidate built, no traceback, and the drift the manifest measured.
``--backend onnxruntime`` keeps each build to seconds (the AOTInductor candidate's C++ compile is
what the default adds; the CPU matrix covers it)."""

from __future__ import annotations

import json

import pytest

from tests.conftest import run_cli

transformers = pytest.importorskip("transformers")

SMALL = dict(vocab_size=512, max_position_embeddings=64)
DECODER = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)
ENCODER = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4)

FAMILIES = {
    "llama": lambda: transformers.LlamaForCausalLM(transformers.LlamaConfig(**SMALL, **DECODER)),
    "qwen2": lambda: transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**SMALL, **DECODER)),
    "mistral": lambda: transformers.MistralForCausalLM(transformers.MistralConfig(**SMALL, **DECODER)),
    "gpt2": lambda: transformers.GPT2LMHeadModel(transformers.GPT2Config(vocab_size=512, n_positions=64, n_embd=64,
                                                                         n_layer=2, n_head=4, bos_token_id=0,
                                                                         eos_token_id=0)),
    "bert": lambda: transformers.BertModel(transformers.BertConfig(**SMALL, **ENCODER)),
    "distilbert": lambda: transformers.DistilBertModel(transformers.DistilBertConfig(
        vocab_size=512, max_position_embeddings=64, dim=64, hidden_dim=128, n_layers=2, n_heads=4)),
}

CELLS = [("llama", "fp32"), ("qwen2", "fp32"), ("mistral", "fp32"), ("gpt2", "fp32"), ("bert", "int8"),
         ("distilbert", "int8"), ("qwen2", "int8")]


@pytest.fixture(scope="module")
def zoo(tmp_path_factory):
    import torch

    folder = tmp_path_factory.mktemp("zoo")
    for name, make in FAMILIES.items():
        torch.manual_seed(0)
        make().eval().save_pretrained(folder / f"tiny-{name}")
    return folder


@pytest.mark.slow
@pytest.mark.parametrize(("family", "precision"), CELLS, ids=[f"{f}-{p}" for f, p in CELLS])
def test_a_transformers_folder_builds_from_the_command_line(zoo, family, precision):
    out = f"dist-{family}-{precision}"
    proc = run_cli("build", f"tiny-{family}", f"--{precision}", "--backend", "onnxruntime", "--dim", "batch=1:2:4",
                   "--dim", "seq=1:16:32", "--batch-sizes", "1,4", "-o", out, "--json", "-q", "--strict",
                   cwd=zoo, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    manifest = json.loads((zoo / out / "manifest.json").read_text())
    statuses = {c["recipe"]: c["status"] for c in manifest["candidates"]}
    assert "failed" not in statuses.values(), statuses
    worst = manifest["validation"]["drift"]["worst"]
    assert manifest["validation"]["verdict"]["passed"]
    assert worst["cosine_min"] >= (0.9999 if precision == "fp32" else 0.95), worst
