"""transformers' own architectures, as a user brings them: a folder written by ``save_pretrained``
(config.json and safetensors, tiny random configs), built from the command line in the folder that
holds it, with a relative path.

This is the first slice of the zoo: the families whose default ONNX Runtime build failed before
(Llama, Qwen2 and Mistral on ONNX Runtime's RMSNorm op that onnx's checker does not know, GPT-2 on a
fusion ONNX Runtime refused, ELECTRA's token-classification head on an output name, BERT-family
``--int8`` on bias initializers the exporter shares), INT4 of Llama and GPT-2, image and audio models
built from the input they read (ViT, ResNet, wav2vec2), and an encoder-decoder refused with what to do. Each
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
    "electra-tokens": lambda: transformers.ElectraForTokenClassification(transformers.ElectraConfig(
        **SMALL, embedding_size=64, **ENCODER, num_labels=5)),
    "vit": lambda: transformers.ViTForImageClassification(transformers.ViTConfig(
        image_size=32, patch_size=8, num_labels=10, **ENCODER)),
    "resnet": lambda: transformers.ResNetModel(transformers.ResNetConfig(embedding_size=16, hidden_sizes=[16, 32],
                                                                         depths=[1, 1])),
    "wav2vec2": lambda: transformers.Wav2Vec2ForCTC(transformers.Wav2Vec2Config(
        vocab_size=32, **ENCODER, conv_dim=(32, 32), conv_stride=(5, 4), conv_kernel=(10, 4),
        num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=4)),
    "bart": lambda: transformers.BartModel(transformers.BartConfig(
        **SMALL, d_model=64, encoder_layers=1, decoder_layers=1, encoder_attention_heads=4, decoder_attention_heads=4,
        encoder_ffn_dim=128, decoder_ffn_dim=128)),
    "gptneox": lambda: transformers.GPTNeoXForCausalLM(transformers.GPTNeoXConfig(**SMALL, **ENCODER)),
    "opt": lambda: transformers.OPTForCausalLM(transformers.OPTConfig(
        **SMALL, hidden_size=64, ffn_dim=128, num_hidden_layers=2, num_attention_heads=4, word_embed_proj_dim=64)),
    "gemma": lambda: transformers.GemmaForCausalLM(transformers.GemmaConfig(**SMALL, **DECODER, head_dim=16)),
    "qwen3": lambda: transformers.Qwen3ForCausalLM(transformers.Qwen3Config(**SMALL, **DECODER, head_dim=16)),
    "phi3": lambda: transformers.Phi3ForCausalLM(transformers.Phi3Config(**SMALL, **DECODER, pad_token_id=0)),
    "smollm": lambda: transformers.LlamaForCausalLM(transformers.LlamaConfig(  # SmolLM-135M's widths, 2 layers
        **SMALL, hidden_size=576, intermediate_size=1536, num_hidden_layers=2, num_attention_heads=9,
        num_key_value_heads=3)),
    "roberta": lambda: transformers.RobertaModel(transformers.RobertaConfig(vocab_size=512, max_position_embeddings=66,
                                                                            **ENCODER)),
    "xlmr-classifier": lambda: transformers.XLMRobertaForSequenceClassification(transformers.XLMRobertaConfig(
        vocab_size=512, max_position_embeddings=66, **ENCODER, num_labels=3)),
    "debertav2": lambda: transformers.DebertaV2Model(transformers.DebertaV2Config(**SMALL, **ENCODER)),
    "modernbert-mlm": lambda: transformers.ModernBertForMaskedLM(transformers.ModernBertConfig(
        **SMALL, **ENCODER, pad_token_id=0, bos_token_id=1, eos_token_id=2, cls_token_id=1, sep_token_id=2)),
    "t5-encoder": lambda: transformers.T5EncoderModel(transformers.T5Config(
        vocab_size=512, d_model=64, d_kv=16, d_ff=128, num_layers=2, num_heads=4)),
    "convnext": lambda: transformers.ConvNextForImageClassification(transformers.ConvNextConfig(
        num_stages=2, hidden_sizes=[16, 32], depths=[1, 1], image_size=32, num_labels=5)),
    "swin": lambda: transformers.SwinModel(transformers.SwinConfig(
        image_size=32, patch_size=4, embed_dim=16, depths=[1, 1], num_heads=[2, 2], window_size=4)),
    "clip-vision": lambda: transformers.CLIPVisionModel(transformers.CLIPVisionConfig(image_size=32, patch_size=8,
                                                                                       **ENCODER)),
    "whisper-encoder": lambda: transformers.WhisperForAudioClassification(transformers.WhisperConfig(
        vocab_size=512, d_model=64, encoder_layers=1, decoder_layers=1, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128, num_mel_bins=16, max_source_positions=32)),
    "distilbert": lambda: transformers.DistilBertModel(transformers.DistilBertConfig(
        vocab_size=512, max_position_embeddings=64, dim=64, hidden_dim=128, n_layers=2, n_heads=4)),
}

CELLS = [("llama", "fp32"), ("qwen2", "fp32"), ("mistral", "fp32"), ("gpt2", "fp32"), ("electra-tokens", "fp32"),
         ("vit", "fp32"), ("resnet", "fp32"), ("wav2vec2", "fp32"), ("bert", "int8"), ("distilbert", "int8"),
         ("qwen2", "int8"), ("vit", "int8"), ("gptneox", "fp32"), ("opt", "fp32"), ("gemma", "fp32"), ("qwen3", "fp32"),
         ("phi3", "fp32"), ("roberta", "fp32"), ("xlmr-classifier", "int8"), ("debertav2", "fp32"),
         ("modernbert-mlm", "fp32"), ("t5-encoder", "fp32"), ("convnext", "fp32"), ("swin", "fp32"),
         ("clip-vision", "fp32"), ("whisper-encoder", "fp32")]
INPUT = {"vit": ("pixel_values", ["batch", 3, 32, 32], "logits"), "resnet": ("pixel_values", ["batch", 3, 224, 224], "pooler_output"),
         "wav2vec2": ("input_values", ["batch", "samples"], "logits"), "convnext": ("pixel_values", ["batch", 3, 32, 32], "logits"),
         "swin": ("pixel_values", ["batch", 3, 32, 32], "last_hidden_state"),
         "clip-vision": ("pixel_values", ["batch", 3, 32, 32], "last_hidden_state"),
         "whisper-encoder": ("input_features", ["batch", 16, 64], "logits")}
"""what the image and audio models read (from the config) and answer"""


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
    media = {"wav2vec2": ["--dim", "samples=4000:8000:16000"]}
    dims = media.get(family, [] if family in INPUT else ["--dim", "seq=1:16:32"])
    proc = run_cli("build", f"tiny-{family}", f"--{precision}", "--backend", "onnxruntime", "--dim", "batch=1:2:4",
                   *dims, "--batch-sizes", "1,4", "-o", out, "--json", "-q", "--strict", cwd=zoo, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    manifest = json.loads((zoo / out / "manifest.json").read_text())
    statuses = {c["recipe"]: c["status"] for c in manifest["candidates"]}
    assert "failed" not in statuses.values(), statuses
    if family in INPUT:
        name, shape, output = INPUT[family]
        assert [(i["name"], i["shape"]) for i in manifest["inputs"]["inputs"]] == [(name, shape)]
        assert [o["name"] for o in manifest["outputs"]] == [output]
    worst = manifest["validation"]["drift"]["worst"]
    assert manifest["validation"]["verdict"]["passed"]
    assert worst["cosine_min"] >= (0.9999 if precision == "fp32" else 0.95), worst


def build_int4(zoo, family):
    out = f"dist-{family}-int4"
    proc = run_cli("build", f"tiny-{family}", "--int4", "--backend", "onnxruntime", "--dim", "batch=1:2:4",
                   "--dim", "seq=1:16:32", "--batch-sizes", "1,4", "-o", out, "--json", "-q", "--strict",
                   cwd=zoo, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    manifest = json.loads((zoo / out / "manifest.json").read_text())
    assert manifest["validation"]["verdict"]["passed"] and manifest["precision"] == "int4"
    return zoo / out, next(p for p in manifest["passes"] if p["name"] == "quantize_int4")


@pytest.mark.slow
def test_int4_of_a_model_no_layer_of_which_128_divides_takes_one_group_size_its_checkpoint_holds(zoo):
    """Llama at hidden 64 (as SmolLM-135M at 576): 128 divides no layer; the whole model takes 64, and
    transformers (through gptqmodel) loads the GPTQ checkpoint and computes what the model does."""
    import torch

    out, quantized = build_int4(zoo, "llama")
    assert {row["group_size"] for row in quantized["details"]["layers"]} == {64}
    assert len(quantized["details"]["layers"]) == 14 and quantized["details"]["checkpoint"]["format"] == "gptq"
    loaded, info = transformers.AutoModelForCausalLM.from_pretrained(
        out / "servers" / "vllm", dtype=torch.float32, device_map="cpu", output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    source = transformers.AutoModelForCausalLM.from_pretrained(zoo / "tiny-llama").eval()
    ids = torch.randint(0, 512, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        got, want = loaded(ids).logits.float(), source(ids).logits
    assert torch.nn.functional.cosine_similarity(got.flatten(1), want.flatten(1)).min() >= 0.98


@pytest.mark.slow
def test_int4_of_gpt2_quantizes_its_conv1d_layers(zoo):
    """GPT-2's projections are transformers' Conv1D (a Linear with its weight transposed): all eight go
    to INT4; no checkpoint, since transformers cannot load a GPTQ GPT-2, and the note says so."""
    out, quantized = build_int4(zoo, "gpt2")
    names = {row["name"] for row in quantized["details"]["layers"]}
    assert len(names) == 8 and any(name.endswith("attn.c_attn") for name in names)
    assert any("Conv1D layers quantized" in note for note in quantized["notes"])
    assert any(note.startswith("no 4-bit checkpoint: transformers") for note in quantized["notes"])
    assert not (out / "servers" / "vllm").exists()


def test_an_encoder_decoder_folder_is_refused_with_what_to_build(zoo):
    proc = run_cli("build", "tiny-bart", "-q", cwd=zoo)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "encoder-decoder model (BartModel)" in proc.stderr and "get_encoder()" in proc.stderr
    assert not (zoo / "dist").exists()


@pytest.mark.slow
def test_int4_of_smollm_widths_takes_group_size_64(zoo):
    """SmolLM-135M's layers are 576 and 1536 wide: 128 divides neither 576 nor the checkpoint's one size."""
    _, quantized = build_int4(zoo, "smollm")
    assert {row["group_size"] for row in quantized["details"]["layers"]} == {64}
    assert quantized["details"]["checkpoint"]["format"] == "gptq"
