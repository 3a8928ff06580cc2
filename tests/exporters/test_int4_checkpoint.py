"""GPTQ and AWQ checkpoint folders: packed layouts, config, errors, and loading by real consumers.

The layouts are checked two ways. Always: the tensors are unpacked here, independently of the
packer, the way the loaders document it (vLLM ``gptq.py``/``awq.py``, GPTQModel's
``dequantize_weight`` and AutoAWQ's ``unpack_awq``/``reverse_awq_order``), on a hand-made layer
whose int32 words are written out by hand and on random layers. Where GPTQModel and optimum are
installed, transformers loads each folder on CPU and its own dequantized weights must equal
:meth:`Int4Weight.effective_weight` (scales rounded to fp16) exactly.
"""

from __future__ import annotations

import importlib.util
import json

import pytest
import torch
from safetensors.torch import load_file
from torch import nn

from infopt.core.errors import UsageError
from infopt.exporters.int4_checkpoint import (
    CheckpointLayoutError,
    CheckpointSource,
    checkpoint_format,
    pack_awq,
    pack_gptq,
    write_awq_checkpoint,
    write_gptq_checkpoint,
)
from infopt.quantize.int4_format import (
    Int4Linear,
    Int4Weight,
    grid,
    int4_layers,
    quantizable_linears,
    quantize_codes,
    replace_module,
)

transformers = pytest.importorskip("transformers")

GROUP = 32
AWQ_REVERSE_ORDER = [0, 4, 1, 5, 2, 6, 3, 7]
HAS_CONSUMER = all(importlib.util.find_spec(m) is not None for m in ("gptqmodel", "optimum", "accelerate"))
needs_consumer = pytest.mark.skipif(
    not HAS_CONSUMER, reason="transformers loads GPTQ/AWQ checkpoints on CPU only through gptqmodel + optimum + "
                             "accelerate, which are not installed (pip install gptqmodel optimum accelerate)")


def rtn(weight: torch.Tensor, symmetric: bool, group_size: int, g_idx: torch.Tensor | None = None) -> Int4Weight:
    """Round-to-nearest INT4 of ``weight`` [N, K]; with ``g_idx`` the groups are scattered (act-order)."""
    n, k = weight.shape
    groups = g_idx if g_idx is not None else torch.arange(k) // group_size
    scales, zeros, codes = torch.empty(n, k // group_size), torch.empty(n, k // group_size), torch.empty(n, k)
    for j in range(k // group_size):
        cols = (groups == j).nonzero().flatten()
        scale, zero = grid(weight[:, cols], symmetric)
        scales[:, j], zeros[:, j] = scale, zero
        codes[:, cols] = quantize_codes(weight[:, cols], scale, zero)
    return Int4Weight.from_codes(codes, scales, zeros, group_size, symmetric, g_idx=g_idx)


def quantize(model: nn.Module, symmetric: bool, act_order: bool = False, seed: int = 0) -> nn.Module:
    gen = torch.Generator().manual_seed(seed)
    for name, linear in list(quantizable_linears(model)):
        k = linear.in_features
        g_idx = None
        if act_order:
            g_idx = torch.empty(k, dtype=torch.long)
            g_idx[torch.randperm(k, generator=gen)] = torch.arange(k) // GROUP
        replace_module(model, name, Int4Linear(rtn(linear.weight.detach().float(), symmetric, GROUP, g_idx),
                                               linear.bias))
    return model.eval()


def tiny_llama(symmetric: bool, act_order: bool = False, zero_group: bool = False, tied: bool = False) -> nn.Module:
    """A 2-layer Llama (hidden 64, intermediate 128, vocab 128); ``zero_group`` zeroes one row group; ``tied``
    ties its head to the embedding."""
    torch.manual_seed(0)
    config = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, vocab_size=128,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                      tie_word_embeddings=tied)
    model = transformers.LlamaForCausalLM(config)
    if zero_group:
        with torch.no_grad():
            model.model.layers[0].mlp.up_proj.weight[3, :GROUP] = 0
    return quantize(model.eval(), symmetric, act_order)


def tiny_bert(symmetric: bool) -> nn.Module:
    torch.manual_seed(0)
    config = transformers.BertConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, vocab_size=128,
                                     num_attention_heads=4, max_position_embeddings=64)
    return quantize(transformers.BertModel(config).eval(), symmetric)


def signed(word: int) -> int:
    return word - 2**32 if word >= 2**31 else word


def nibbles(words: torch.Tensor) -> list[torch.Tensor]:
    """The eight 4-bit fields of each int32, lowest first."""
    return [(words >> (4 * i)) & 0xF for i in range(8)]


def unpack_gptq(tensors: dict[str, torch.Tensor], prefix: str, checkpoint_format: str) -> torch.Tensor:
    """The float32 weight [N, K] a GPTQ loader rebuilds: codes along K, zeros along N, +1 for v1."""
    qweight, qzeros = tensors[f"{prefix}.qweight"], tensors[f"{prefix}.qzeros"]
    scales, g_idx = tensors[f"{prefix}.scales"].float(), tensors[f"{prefix}.g_idx"].long()
    codes = torch.stack(nibbles(qweight), dim=1).reshape(qweight.shape[0] * 8, qweight.shape[1])
    zeros = torch.stack(nibbles(qzeros), dim=2).reshape(qzeros.shape[0], qzeros.shape[1] * 8)
    if checkpoint_format == "gptq":
        zeros = zeros + 1
    return ((codes - zeros[g_idx]).float() * scales[g_idx]).t()


def unpack_awq(tensors: dict[str, torch.Tensor], prefix: str, group_size: int) -> torch.Tensor:
    """The float32 weight [N, K] AutoAWQ rebuilds: unpack lowest nibble first, then undo AWQ's order."""
    def columns(words):
        flat = torch.stack(nibbles(words), dim=2).reshape(words.shape[0], -1)
        order = torch.arange(flat.shape[1]).view(-1, 8)[:, AWQ_REVERSE_ORDER].reshape(-1)
        return flat[:, order]

    codes, zeros = columns(tensors[f"{prefix}.qweight"]), columns(tensors[f"{prefix}.qzeros"])
    scales = tensors[f"{prefix}.scales"].float()
    zeros = zeros.repeat_interleave(group_size, dim=0)
    return ((codes - zeros).float() * scales.repeat_interleave(group_size, dim=0)).t()


def expected_weight(weight: Int4Weight) -> torch.Tensor:
    """What a loader computes with: the effective weight with scales rounded to fp16."""
    return Int4Weight(weight.qweight, weight.scales.half().float(), weight.zeros, weight.group_size,
                      weight.symmetric, weight.g_idx, weight.input_scale).effective_weight()


def hand_layer() -> Int4Weight:
    """N = K = 8, one group: code(n, k) = n + k, zero(n) = n + 1, scale(n) = 0.5."""
    n, k = torch.meshgrid(torch.arange(8), torch.arange(8), indexing="ij")
    return Int4Weight.from_codes((n + k).float(), torch.full((8, 1), 0.5), torch.arange(1, 9).float()[:, None],
                                 group_size=8, symmetric=False)


def test_gptq_hand_example():
    layer = hand_layer()
    v1 = pack_gptq("hand", layer, "gptq")
    # qweight[0, n]: code(n, k) at bits 4k, so the hex digits read n+7 ... n+0.
    assert v1["qweight"].tolist() == [[signed(w) for w in (0x76543210, 0x87654321, 0x98765432, 0xA9876543,
                                                           0xBA987654, 0xCBA98765, 0xDCBA9876, 0xEDCBA987)]]
    # qzeros[0, 0]: zero(n) - 1 = n at bits 4n (v1).
    assert v1["qzeros"].tolist() == [[0x76543210]]
    assert v1["scales"].dtype == torch.float16 and v1["scales"].tolist() == [[0.5] * 8]
    assert v1["g_idx"].tolist() == [0] * 8
    assert pack_gptq("hand", layer, "gptq_v2")["qzeros"].tolist() == [[signed(0x87654321)]]


def test_awq_hand_example():
    packed = pack_awq("hand", hand_layer())
    # qweight[k, 0]: nibble i holds output ORDER[i] = [0, 2, 4, 6, 1, 3, 5, 7][i], code k + ORDER[i].
    assert packed["qweight"].tolist() == [[signed(w)] for w in (0x75316420, 0x86427531, 0x97538642, 0xA8649753,
                                                                0xB975A864, 0xCA86B975, 0xDB97CA86, 0xECA8DB97)]
    assert packed["qzeros"].tolist() == [[signed(0x86427531)]]
    assert set(packed) == {"qweight", "qzeros", "scales"}


@pytest.mark.parametrize("checkpoint_format", ["gptq", "gptq_v2"])
@pytest.mark.parametrize("act_order", [False, True], ids=["groups", "act-order"])
@pytest.mark.parametrize("symmetric", [True, False], ids=["sym", "asym"])
def test_gptq_round_trip(tmp_path, symmetric, act_order, checkpoint_format):
    model = tiny_llama(symmetric, act_order, zero_group=not symmetric)
    out = write_gptq_checkpoint(model, tmp_path / "ckpt", checkpoint_format=checkpoint_format)
    tensors = load_file(out / "model.safetensors")
    layers = int4_layers(model)
    assert len(layers) == 14
    for name, weight in layers.items():
        n, k = weight.out_features, weight.in_features
        assert tensors[f"{name}.qweight"].shape == (k // 8, n) and tensors[f"{name}.qweight"].dtype == torch.int32
        assert tensors[f"{name}.qzeros"].shape == (k // GROUP, n // 8)
        assert tensors[f"{name}.scales"].shape == (k // GROUP, n) and tensors[f"{name}.scales"].dtype == torch.float16
        assert torch.equal(unpack_gptq(tensors, name, checkpoint_format), expected_weight(weight)), name
    quant = json.loads((out / "config.json").read_text())["quantization_config"]
    assert quant["quant_method"] == "gptq" and quant["bits"] == 4 and quant["group_size"] == GROUP
    assert quant["desc_act"] is act_order and quant["sym"] is symmetric
    assert quant["checkpoint_format"] == checkpoint_format
    assert quant["block_name_to_quantize"] == "model.layers"
    assert sorted(quant["modules_in_block_to_quantize"][0]) == sorted(layers)
    assert_dense_tensors(model, tensors)


@pytest.mark.parametrize("symmetric", [True, False], ids=["sym", "asym"])
def test_awq_round_trip(tmp_path, symmetric):
    model = tiny_llama(symmetric)
    out = write_awq_checkpoint(model, tmp_path / "ckpt")
    tensors = load_file(out / "model.safetensors")
    for name, weight in int4_layers(model).items():
        n, k = weight.out_features, weight.in_features
        assert tensors[f"{name}.qweight"].shape == (k, n // 8) and tensors[f"{name}.qweight"].dtype == torch.int32
        assert tensors[f"{name}.qzeros"].shape == (k // GROUP, n // 8)
        assert f"{name}.g_idx" not in tensors
        assert torch.equal(unpack_awq(tensors, name, GROUP), expected_weight(weight)), name
    config = json.loads((out / "config.json").read_text())
    assert config["quantization_config"] == {"quant_method": "awq", "bits": 4, "group_size": GROUP,
                                             "zero_point": True, "version": "gemm",
                                             "modules_to_not_convert": ["lm_head"]}
    assert config["model_type"] == "llama" and config["architectures"] == ["LlamaForCausalLM"]
    assert_dense_tensors(model, tensors)


def assert_dense_tensors(model: nn.Module, tensors: dict[str, torch.Tensor]) -> None:
    """Every other state-dict entry is there under its own name, in fp16, with the model's values."""
    layers = int4_layers(model)
    dense = {k: v for k, v in model.state_dict().items() if k.rpartition(".")[0] not in layers}
    assert "lm_head.weight" in dense and "model.norm.weight" in dense
    for key, value in dense.items():
        assert tensors[key].dtype == torch.float16, key
        assert torch.equal(tensors[key], value.half()), key
    quantized = {f"{name}.{part}" for name in layers for part in ("qweight", "qzeros", "scales", "g_idx", "bias")}
    assert set(tensors) - set(dense) <= quantized


def test_gptq_v1_zero_point_zero(tmp_path):
    model = tiny_llama(symmetric=False, zero_group=True)
    layer = int4_layers(model)["model.layers.0.mlp.up_proj"]
    assert layer.zeros[3, 0] == 0
    packed = pack_gptq("up_proj", layer, "gptq")
    assert (packed["qzeros"][0, 0] >> 12) & 0xF == 0, "zero 0 is written as zero 1 (stored 0) in v1"
    tensors = {f"up_proj.{k}": v for k, v in packed.items()}
    assert torch.equal(unpack_gptq(tensors, "up_proj", "gptq"), expected_weight(layer))

    codes = torch.zeros(8, 32)
    codes[0, 0] = 15
    stuck = Int4Weight.from_codes(codes, torch.ones(8, 1), torch.zeros(8, 1), group_size=32, symmetric=False)
    with pytest.raises(CheckpointLayoutError, match="gptq_v2") as err:
        pack_gptq("blocks.0.fc", stuck, "gptq")
    assert "blocks.0.fc" in str(err.value)
    v2 = {f"fc.{k}": v for k, v in pack_gptq("fc", stuck, "gptq_v2").items()}
    assert torch.equal(unpack_gptq(v2, "fc", "gptq_v2"), expected_weight(stuck))


def test_checkpoint_format_chooses_v2_only_where_v1_cannot_hold_a_zero_and_writes_nothing(tmp_path):
    assert checkpoint_format(tiny_llama(symmetric=False, zero_group=True), "gptq") == "gptq"
    codes = torch.zeros(8, 32)
    codes[0, 0] = 15
    stuck = Int4Weight.from_codes(codes, torch.ones(8, 1), torch.zeros(8, 1), group_size=32, symmetric=False)
    assert checkpoint_format(with_layer(stuck), "gptq") == "gptq_v2"
    assert checkpoint_format(with_layer(stuck), "awq") == "awq"
    scaled = rtn(torch.randn(16, 64), symmetric=False, group_size=GROUP)
    scaled.input_scale = torch.rand(64) + 0.5
    with pytest.raises(CheckpointLayoutError, match="proj"):
        checkpoint_format(with_layer(scaled), "gptq")
    assert_nothing_written(tmp_path)


def test_vllm_emitter_writes_the_checkpoint_the_pass_handed_on_and_nothing_without_one(tmp_path):
    from infopt.exporters.servers import registered
    from infopt.runtime import backends

    vllm = next(e for e in registered() if e.name == "vllm")
    model = tiny_llama(symmetric=True)
    job = servers_job(tmp_path, backends.for_file("model.onnx"), {})
    assert vllm.serves_backend(job.backend) and vllm.write(job) is None
    assert not (tmp_path / "servers").exists()
    job.products = {CheckpointSource: CheckpointSource(model, checkpoint_format(model, "gptq"))}
    folder = vllm.write(job)
    assert folder == tmp_path / "servers" / "vllm"
    quant = json.loads((folder / "config.json").read_text())["quantization_config"]
    assert quant["quant_method"] == "gptq" and quant["sym"] is True
    tensors = load_file(str(folder / "model.safetensors"))
    prefix = "model.layers.0.mlp.up_proj"
    assert torch.equal(unpack_gptq(tensors, prefix, "gptq"), expected_weight(int4_layers(model)[prefix]))



def test_a_checkpoint_written_ahead_lets_its_module_go_and_the_emitter_copies_it_whole(tmp_path):
    """A text-generation build writes the checkpoint before it judges its folder, then frees the module."""
    import gc
    import weakref

    from infopt.exporters.servers import registered
    from infopt.runtime import backends

    model = tiny_llama(symmetric=False, act_order=True)
    source = CheckpointSource(model, checkpoint_format(model, "gptq"), None)
    ahead = source.write_ahead(tmp_path / "work" / "ckpt")
    held = weakref.ref(model)
    del model, source
    gc.collect()
    assert ahead.module is None and held() is None
    job = servers_job(tmp_path / "stage", backends.for_file("model.onnx"), {CheckpointSource: ahead})
    folder = next(e for e in registered() if e.name == "vllm").write(job)
    written = sorted(p.name for p in (tmp_path / "work" / "ckpt").iterdir())
    assert sorted(p.name for p in folder.iterdir()) == written and "model.safetensors" in written
    for name in written:
        assert (folder / name).read_bytes() == (tmp_path / "work" / "ckpt" / name).read_bytes(), name


def servers_job(stage, backend, products):
    from infopt.core.inputspec import InputSpec
    from infopt.exporters.servers import EmitJob

    spec = InputSpec.parse(["input_ids:int64[batch,seq]"])
    return EmitJob(stage, "tiny", stage / "model.onnx", stage / "model" / "model.onnx", spec, {}, "cpu", backend,
                   products=products)


def test_bert_gptq_names_every_quantized_layer(tmp_path):
    model = tiny_bert(symmetric=True)
    out = write_gptq_checkpoint(model, tmp_path / "bert")
    quant = json.loads((out / "config.json").read_text())["quantization_config"]
    assert "pooler.dense" in quant["modules_in_block_to_quantize"][0]
    assert quant["block_name_to_quantize"] == ""
    assert json.loads((out / "config.json").read_text())["architectures"] == ["BertModel"]


def test_source_files_and_force(tmp_path):
    source = tmp_path / "src"
    source.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json", "config.json",
                 "model.safetensors", "notes.txt"):
        (source / name).write_text(f"{name}\n")
    model = tiny_llama(symmetric=True)
    out = write_gptq_checkpoint(model, tmp_path / "ckpt", source_dir=source)
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "generation_config.json", "model.safetensors",
                                                     "tokenizer.json", "tokenizer_config.json"]
    assert (out / "tokenizer.json").read_text() == "tokenizer.json\n"
    assert "quantization_config" in json.loads((out / "config.json").read_text())
    with pytest.raises(UsageError, match="--force"):
        write_awq_checkpoint(model, out)
    write_awq_checkpoint(model, out, force=True)
    assert json.loads((out / "config.json").read_text())["quantization_config"]["quant_method"] == "awq"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt", "src"]


def with_layer(weight: Int4Weight) -> nn.Module:
    model = nn.Sequential()
    model.add_module("proj", Int4Linear(weight, None))
    return model


def assert_nothing_written(tmp_path):
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("writer", [write_gptq_checkpoint, write_awq_checkpoint], ids=["gptq", "awq"])
def test_input_scale_is_refused(tmp_path, writer):
    weight = rtn(torch.randn(16, 64), symmetric=False, group_size=GROUP)
    weight.input_scale = torch.rand(64) + 0.5
    with pytest.raises(CheckpointLayoutError, match="ONNX") as err:
        writer(with_layer(weight), tmp_path / "out", config={"model_type": "custom"})
    assert "proj" in str(err.value) and "GPTQ or RTN" in str(err.value)
    assert_nothing_written(tmp_path)


def test_awq_refuses_act_order(tmp_path):
    g_idx = torch.arange(64).flip(0) // GROUP
    weight = rtn(torch.randn(16, 64), symmetric=True, group_size=GROUP, g_idx=g_idx)
    assert weight.g_idx is not None
    with pytest.raises(CheckpointLayoutError, match="act-order") as err:
        write_awq_checkpoint(with_layer(weight), tmp_path / "out", config={"model_type": "custom"})
    assert "proj" in str(err.value)
    assert_nothing_written(tmp_path)
    write_gptq_checkpoint(with_layer(weight), tmp_path / "out", config={"model_type": "custom"})
    assert (tmp_path / "out" / "model.safetensors").is_file()


@pytest.mark.parametrize("writer", [write_gptq_checkpoint, write_awq_checkpoint], ids=["gptq", "awq"])
def test_outputs_not_multiple_of_8(tmp_path, writer):
    weight = rtn(torch.randn(12, 64), symmetric=True, group_size=GROUP)
    with pytest.raises(CheckpointLayoutError, match="12 outputs, not a multiple of 8") as err:
        writer(with_layer(weight), tmp_path / "out", config={"model_type": "custom"})
    assert err.value.where == "proj"
    assert_nothing_written(tmp_path)


def test_scales_beyond_fp16(tmp_path):
    weight = rtn(torch.randn(16, 64) * 1e6, symmetric=True, group_size=GROUP)
    with pytest.raises(CheckpointLayoutError, match="fp16"):
        write_gptq_checkpoint(with_layer(weight), tmp_path / "out", config={"model_type": "custom"})
    assert_nothing_written(tmp_path)


def test_mixed_group_sizes(tmp_path):
    model = nn.Sequential()
    model.add_module("a", Int4Linear(rtn(torch.randn(16, 64), True, 32), None))
    model.add_module("b", Int4Linear(rtn(torch.randn(16, 16), True, 16), None))
    with pytest.raises(CheckpointLayoutError, match="a: 32, b: 16"):
        write_awq_checkpoint(model, tmp_path / "out", config={"model_type": "custom"})
    assert_nothing_written(tmp_path)


def test_no_int4_layers(tmp_path):
    with pytest.raises(UsageError, match="no Int4Linear layers"):
        write_gptq_checkpoint(nn.Sequential(nn.Linear(8, 8)), tmp_path / "out", config={"model_type": "custom"})
    assert_nothing_written(tmp_path)


def test_config_required_without_hf_model(tmp_path):
    weight = rtn(torch.randn(16, 64), symmetric=True, group_size=GROUP)
    with pytest.raises(UsageError, match="config="):
        write_gptq_checkpoint(with_layer(weight), tmp_path / "out")
    assert_nothing_written(tmp_path)


def load_with_transformers(folder, auto_class):
    model, info = auto_class.from_pretrained(folder, dtype=torch.float32, device_map="cpu", output_loading_info=True)
    assert not info["missing_keys"], info["missing_keys"]
    assert not info["unexpected_keys"], info["unexpected_keys"]
    return model


def assert_consumer_weights(model: nn.Module, loaded: nn.Module, method: str) -> None:
    """GPTQModel's own dequantization of the loaded buffers (fp16, like its scales) equals ours.

    Called before the first forward, which repacks the buffers for the CPU int4 kernel.
    """
    for name, weight in int4_layers(model).items():
        module = loaded.get_submodule(name)
        if method == "gptq":
            got = module.dequantize_weight().t()
        else:
            got = module.awq_weight_dequantize(torch.device("cpu"), torch.float32).t()
        want = expected_weight(weight).to(module.scales.dtype)
        assert module.scales.dtype == torch.float16
        assert torch.equal(got.to(want.dtype), want), name


@needs_consumer
@pytest.mark.parametrize("method, symmetric, act_order, checkpoint_format", [
    ("gptq", True, False, "gptq"), ("gptq", False, True, "gptq"), ("gptq", False, False, "gptq_v2"),
    ("awq", False, False, None), ("awq", True, False, None)])
def test_transformers_loads_llama(tmp_path, method, symmetric, act_order, checkpoint_format):
    model = tiny_llama(symmetric, act_order, zero_group=not symmetric)
    if method == "gptq":
        out = write_gptq_checkpoint(model, tmp_path / "ckpt", checkpoint_format=checkpoint_format)
    else:
        out = write_awq_checkpoint(model, tmp_path / "ckpt")
    loaded = load_with_transformers(out, transformers.AutoModelForCausalLM)
    assert_consumer_weights(model, loaded, method)
    ids = torch.randint(0, 128, (2, 9), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want, got = model(ids).logits, loaded(ids).logits
    # GPTQModel's CPU kernel multiplies in bfloat16, so the logits agree to bf16 precision.
    assert torch.allclose(got, want, atol=2e-2 * want.abs().max().item(), rtol=0)


@needs_consumer
@pytest.mark.parametrize("method", ["gptq", "awq"])
def test_transformers_loads_bert(tmp_path, method):
    model = tiny_bert(symmetric=False)
    writer = write_gptq_checkpoint if method == "gptq" else write_awq_checkpoint
    loaded = load_with_transformers(writer(model, tmp_path / "bert"), transformers.AutoModel)
    assert_consumer_weights(model, loaded, method)
    ids = torch.randint(0, 128, (2, 9), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want, got = model(ids).last_hidden_state, loaded(ids).last_hidden_state
    assert torch.allclose(got, want, atol=2e-2 * want.abs().max().item(), rtol=0)


@needs_consumer
def test_a_tied_head_is_written_once_and_transformers_ties_it_again(tmp_path):
    from safetensors import safe_open

    model = tiny_llama(symmetric=True, tied=True)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    out = write_gptq_checkpoint(model, tmp_path / "ckpt")
    with safe_open(str(out / "model.safetensors"), "pt") as f:
        keys = set(f.keys())
        assert "lm_head.weight" not in keys and f.get_tensor("model.embed_tokens.weight").dtype == torch.float16
    loaded = load_with_transformers(out, transformers.AutoModelForCausalLM)
    assert loaded.lm_head.weight.data_ptr() == loaded.model.embed_tokens.weight.data_ptr()
    ids = torch.randint(0, 128, (2, 9), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want, got = model(ids).logits, loaded(ids).logits
    assert torch.allclose(got, want, atol=2e-2 * want.abs().max().item(), rtol=0)
