"""AWQ's input scales folded into the norms before the layers: the same model without the divisions, and no fold
where the norm is not a plain per-feature scale."""

from __future__ import annotations

import copy

import pytest
import torch

transformers = pytest.importorskip("transformers")

from infopt.quantize.int4_config import AWQConfig, AWQGPTQConfig  # noqa: E402
from infopt.quantize.weight_only import quantize_int4  # noqa: E402

SIZES = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=64)


def _model(kind: str):
    torch.manual_seed(0)
    if kind == "llama":
        config = transformers.LlamaConfig(**SIZES)
        model = transformers.LlamaForCausalLM(config)
    else:
        config = transformers.GemmaConfig(**SIZES, head_dim=16)
        model = transformers.GemmaForCausalLM(config)
    for name, param in model.named_parameters():
        if "norm" in name:  # trained norms are not all ones: the fold must divide a real weight
            param.data = (0.5 + torch.rand_like(param)) if kind == "llama" else torch.randn_like(param) * 0.3
    return model.eval()


def _batches():
    g = torch.Generator().manual_seed(1)
    return [(torch.randint(0, 256, (2, 24), generator=g),) for _ in range(4)]


def _logits(model) -> torch.Tensor:
    ids = torch.randint(0, 256, (1, 32), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        return model(ids).logits


def _relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


@pytest.mark.parametrize("share", [0.0, 0.3])
def test_awq_scales_fold_into_llama_norms_and_the_model_computes_the_same(share):
    """Query, key, value, gate and up lose their divisions to the norms; output and down keep theirs. With a share
    of layers held in float for 8 bits, those float layers read the folded inputs too."""
    folded_model, plain_model = _model("llama"), _model("llama")
    config = AWQGPTQConfig(group_size=32)
    folded = quantize_int4(folded_model, config, _batches(), int8_share=share, fold_scales=True)
    plain = quantize_int4(plain_model, config, _batches(), int8_share=share)
    reads_norm = ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj")
    every = {**folded.weights, **folded.spare}
    assert sorted(folded.folded) == sorted(n for n in every if n.endswith(reads_norm))
    assert folded.folded and not plain.folded
    for name, weight in every.items():
        assert (weight.input_scale is None) == (name in folded.folded)
    for name in folded.weights:
        assert (folded_model.get_submodule(name).input_scale is None) == (name in folded.folded)
    assert any(w.input_scale is not None for w in every.values())  # o_proj, down_proj
    assert folded.for_8bit == plain.for_8bit and (share == 0 or folded.for_8bit)
    norm = folded_model.model.layers[0].input_layernorm.weight
    assert not torch.allclose(norm, plain_model.model.layers[0].input_layernorm.weight)
    assert _relative(_logits(folded_model), _logits(plain_model)) < 1e-3


def test_a_norm_scaling_by_one_plus_its_weight_keeps_the_division():
    """Gemma's RMSNorm multiplies by ``1 + w``: dividing ``w`` is not dividing the output, the check says so, and
    the fold is undone exactly."""
    model, plain_model = _model("gemma"), _model("gemma")
    config = AWQGPTQConfig(group_size=32)
    result = quantize_int4(model, config, _batches(), fold_scales=True)
    quantize_int4(plain_model, config, _batches())
    assert result.folded == []
    assert all(w.input_scale is not None for w in result.weights.values())
    for (name, a), (_, b) in zip(model.named_parameters(), plain_model.named_parameters()):
        assert torch.equal(a, b), name
    assert torch.equal(_logits(model), _logits(plain_model))


@pytest.mark.parametrize("config, fold", [(AWQGPTQConfig(group_size=32), False), (AWQConfig(group_size=32), True)])
def test_no_fold_unless_asked_or_with_a_scale_per_layer(config, fold):
    """Folding edits the model's norms, so it happens only when asked; AWQ's scales, one per layer, differ between
    the layers reading one norm, and none folds."""
    model = _model("llama")
    before = copy.deepcopy(model.state_dict())
    result = quantize_int4(model, config, _batches(), fold_scales=fold)
    assert result.folded == [] and all(w.input_scale is not None for w in result.weights.values())
    assert torch.equal(model.model.layers[1].post_attention_layernorm.weight,
                       before["model.layers.1.post_attention_layernorm.weight"])
