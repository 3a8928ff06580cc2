"""Attention of the KV-cache decoder as ONNX Runtime's one fused op, ``com.microsoft::GroupQueryAttention``.

Exported as transformers writes it, each layer's attention is some 40 ONNX nodes (the cache's concat, the
KV heads repeated, the mask built, two MatMuls and a softmax); for a small model on a CPU, running those
small ops costs more than the layer's arithmetic. ONNX Runtime's ``GroupQueryAttention`` does all of it
in one kernel, with the cache's concat (``past_key`` in, ``present_key`` out), grouped KV heads, the causal
mask and the padding (``seqlens_k``: each sequence's total length less one, from the attention mask).

It is put in at the level transformers chooses attention: an attention function registered with
transformers' ``AttentionInterface`` (and a mask function that builds no mask, since the op masks), used by
the model while it is captured. The layer's cache ``update`` hands the new keys and values through
unconcatenated; the attention function calls :func:`gqa`, a torch custom op that keeps the whole
computation one node through ``torch.export``, and the ONNX exporter translates that node to the contrib
op (:func:`translation_table`). Rotary embeddings stay where the model computes them (``do_rotary=0``).

:func:`fusable` says when it applies: every layer reports a layer index, no sliding window shorter than the
context (ONNX Runtime's ``local_window_size`` is then not needed), and no attention sinks.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch

NAME = "infopt_gqa"
"""the attention implementation's name in transformers' registries while a decoder is captured"""
MS_DOMAIN = "com.microsoft"


@torch.library.custom_op("infopt::gqa", mutates_args=())
def gqa(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, past_key: torch.Tensor,
        past_value: torch.Tensor, seqlens_k: torch.Tensor, total_length: torch.Tensor, num_heads: int,
        kv_num_heads: int, scale: float, softcap: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``GroupQueryAttention`` as ONNX Runtime computes it (right-aligned: sequence ``b`` holds
    ``seqlens_k[b] + 1`` keys, the new tokens last). query ``[B, S, H*D]``, key/value ``[B, S, kv*D]``,
    past ``[B, kv, P, D]`` -> output ``[B, S, H*D]``, present key/value ``[B, kv, P+S, D]``."""
    batch, steps, _ = query.shape
    head = past_key.shape[-1]
    k = key.reshape(batch, steps, kv_num_heads, head).transpose(1, 2)
    v = value.reshape(batch, steps, kv_num_heads, head).transpose(1, 2)
    present_key, present_value = torch.cat([past_key, k], 2), torch.cat([past_value, v], 2)
    q = query.reshape(batch, steps, num_heads, head).transpose(1, 2)
    groups = num_heads // kv_num_heads
    keys, values = present_key.repeat_interleave(groups, 1), present_value.repeat_interleave(groups, 1)
    scores = (q.float() @ keys.float().transpose(-1, -2)) * scale
    if softcap > 0:
        scores = softcap * torch.tanh(scores / softcap)
    total = present_key.shape[2]
    lengths = seqlens_k.long() + 1  # [B]
    key_pos = torch.arange(total)
    query_pos = lengths[:, None] - steps + torch.arange(steps)[None, :]  # [B, S]
    allowed = (key_pos[None, None, :] <= query_pos[:, :, None]) & (key_pos[None, None, :] < lengths[:, None, None])
    scores = scores.masked_fill(~allowed[:, None], float("-inf"))
    out = torch.softmax(scores, -1).nan_to_num(0.0) @ values.float()
    out = out.to(query.dtype).transpose(1, 2).reshape(batch, steps, num_heads * head)
    return out, present_key, present_value


@gqa.register_fake
def _(query, key, value, past_key, past_value, seqlens_k, total_length, num_heads, kv_num_heads, scale, softcap):
    batch, steps, _ = query.shape
    present = past_key.new_empty(batch, kv_num_heads, past_key.shape[2] + steps, past_key.shape[3])
    return query.new_empty(query.shape), present, present.clone()


def translation_table() -> dict:
    """``custom_translation_table`` entries for ``torch.onnx.export`` (dynamo): ``infopt::gqa`` ->
    ``com.microsoft::GroupQueryAttention`` (its OpSchema is built here: onnx knows no contrib op)."""
    import onnxscript
    from onnx.defs import OpSchema

    param, option = OpSchema.FormalParameter, OpSchema.FormalParameterOption
    attr = OpSchema.Attribute
    schema = OpSchema(
        "GroupQueryAttention", MS_DOMAIN, 1,
        inputs=[param("query", "T"), param("key", "T"), param("value", "T"), param("past_key", "T"),
                param("past_value", "T"), param("seqlens_k", "M"), param("total_sequence_length", "M"),
                param("cos_cache", "T", param_option=option.Optional),
                param("sin_cache", "T", param_option=option.Optional)],
        outputs=[param("output", "T"), param("present_key", "T"), param("present_value", "T")],
        type_constraints=[("T", ["tensor(float)", "tensor(float16)", "tensor(bfloat16)"], "float"),
                          ("M", ["tensor(int32)"], "lengths")],
        attributes=[attr("num_heads", OpSchema.AttrType.INT, "query heads"),
                    attr("kv_num_heads", OpSchema.AttrType.INT, "key/value heads"),
                    attr("scale", OpSchema.AttrType.FLOAT, "score scale"),
                    attr("softcap", OpSchema.AttrType.FLOAT, "logit softcap, 0 for none"),
                    attr("do_rotary", OpSchema.AttrType.INT, "rotary inside the op")],
    )
    op = onnxscript.values.Op(onnxscript.values.Opset(MS_DOMAIN, 1), "GroupQueryAttention", schema)

    def group_query_attention(query, key, value, past_key, past_value, seqlens_k, total_length, num_heads: int,
                              kv_num_heads: int, scale: float, softcap: float):
        return op(query, key, value, past_key, past_value, seqlens_k, total_length, num_heads=num_heads,
                  kv_num_heads=kv_num_heads, scale=scale, softcap=softcap, do_rotary=0, _num_outputs=3)

    return {torch.ops.infopt.gqa.default: group_query_attention}


def pass_through_cache(config, past: list):
    """A ``DynamicCache`` holding ``past`` whose ``update`` records each layer's new keys and values and hands
    them back unconcatenated, for :func:`gqa` to concat (the cache's length and masks still count the past)."""
    from transformers import DynamicCache

    class PassThroughCache(DynamicCache):
        def update(self, key_states, value_states, layer_idx, *args, **kwargs):
            self.new[layer_idx] = (key_states, value_states)
            return key_states, value_states

    cache = PassThroughCache(config=config)
    for i in range(len(past) // 2):
        DynamicCache.update(cache, past[2 * i], past[2 * i + 1], i)
    cache.past, cache.new = past, {}
    return cache


class Attention:
    """The attention function transformers calls per layer while the decoder is captured; it fills
    ``presents`` (layer -> present key, value)."""

    def __init__(self, cache, seqlens_k, total_length):
        self.cache, self.seqlens_k, self.total_length, self.presents = cache, seqlens_k, total_length, {}

    def __call__(self, module, query, key, value, attention_mask, scaling=None, dropout=0.0, softcap=None,
                 sliding_window=None, **kwargs: Any):
        layer = module.layer_idx
        batch, heads, steps, head = query.shape
        kv_heads = key.shape[1]
        past_key, past_value = self.cache.past[2 * layer], self.cache.past[2 * layer + 1]
        out, present_key, present_value = gqa(
            query.transpose(1, 2).reshape(batch, steps, heads * head), key.transpose(1, 2).reshape(batch, steps, -1),
            value.transpose(1, 2).reshape(batch, steps, -1), past_key, past_value, self.seqlens_k, self.total_length,
            heads, kv_heads, float(scaling if scaling is not None else head ** -0.5), float(softcap or 0.0))
        self.presents[layer] = (present_key, present_value)
        return out.reshape(batch, steps, heads, head), None


def _no_mask(*args, **kwargs):
    return None


@contextlib.contextmanager
def fused_attention(model, attention: Attention):
    """``model`` computes attention with ``attention`` (and builds no mask) inside the block."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(NAME, attention)
    AttentionMaskInterface.register(NAME, _no_mask)
    configs = {id(c): c for c in (model.config, *(m.config for m in model.modules() if hasattr(m, "config")))}
    before = {key: config._attn_implementation for key, config in configs.items()}
    try:
        for config in configs.values():
            config._attn_implementation = NAME
        yield
    finally:
        for key, config in configs.items():
            config._attn_implementation = before[key]


def fusable(model, context: int) -> str | None:
    """None when :func:`fused_attention` applies to ``model``, else why not."""
    config = model.config
    window = getattr(config, "sliding_window", None)
    if isinstance(window, int) and window < context:
        return f"a sliding window of {window} tokens, shorter than the context of {context}"
    if getattr(config, "use_sinks", False) or "gpt_oss" in str(getattr(config, "model_type", "")):
        return "attention sinks"
    layers = [m for m in model.modules() if hasattr(m, "layer_idx") and any(
        n.endswith(("q_proj", "c_attn", "query_key_value", "qkv_proj")) for n, _ in m.named_children())]
    if not layers:
        return "no attention layer with a layer index was found"
    return None
