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
op (:func:`translation_table`).

Rotary embeddings move into the op too (``do_rotary=1``) where their angles depend on the position alone
(:func:`rotary_caches`: a static rope type, one rotary table, rotate-half layout): the table of each
position's cos and sin is computed once from the model's own rotary module and stored as the op's
``cos_cache``/``sin_cache``, and the family's ``apply_rotary_pos_emb`` hands the query and key through
unrotated while the decoder is captured (:func:`rotary_in_attention`). Each layer then runs one op where
the model wrote some 14 (two slices, a negation, a concat, two multiplies and an add, for the query and
the key); a partial rotary (GPT-NeoX, Phi) is the cache's width.

:func:`fusable` says when it applies: every layer reports a layer index, no sliding window shorter than the
context (ONNX Runtime's ``local_window_size`` is then not needed), and no attention sinks.
"""

from __future__ import annotations

import contextlib
import sys
from typing import Any, Iterator

import torch

from infopt.exporters.families import family_of

NAME = "infopt_gqa"
"""the attention implementation's name in transformers' registries while a decoder is captured"""
MS_DOMAIN = "com.microsoft"
STATIC_ROPE = ("default", "linear", "llama3", "yarn")
"""rope types whose angle for a position is the same at any sequence length (dynamic NTK and LongRoPE rescale
with the length, so their table cannot be computed once)"""
NO_ROTARY = "no rotary embedding"
"""what :func:`rotary_caches` answers for a model with learned positions (GPT-2, OPT)"""


@torch.library.custom_op("infopt::gqa", mutates_args=())
def gqa(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, past_key: torch.Tensor,
        past_value: torch.Tensor, seqlens_k: torch.Tensor, total_length: torch.Tensor,
        cos_cache: torch.Tensor | None, sin_cache: torch.Tensor | None, num_heads: int,
        kv_num_heads: int, scale: float, softcap: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``GroupQueryAttention`` as ONNX Runtime computes it (right-aligned: sequence ``b`` holds
    ``seqlens_k[b] + 1`` keys, the new tokens last). query ``[B, S, H*D]``, key/value ``[B, S, kv*D]``,
    past ``[B, kv, P, D]`` -> output ``[B, S, H*D]``, present key/value ``[B, kv, P+S, D]``. With the caches
    (``[positions, rotary/2]``), the new query and key are rotated first, at their positions."""
    batch, steps, _ = query.shape
    head = past_key.shape[-1]
    lengths = seqlens_k.long() + 1  # [B]
    query_pos = lengths[:, None] - steps + torch.arange(steps)[None, :]  # [B, S]
    k = key.reshape(batch, steps, kv_num_heads, head).transpose(1, 2)
    v = value.reshape(batch, steps, kv_num_heads, head).transpose(1, 2)
    q = query.reshape(batch, steps, num_heads, head).transpose(1, 2)
    if cos_cache is not None and sin_cache is not None:
        q, k = _rotate(q, cos_cache, sin_cache, query_pos), _rotate(k, cos_cache, sin_cache, query_pos)
    present_key, present_value = torch.cat([past_key, k], 2), torch.cat([past_value, v], 2)
    groups = num_heads // kv_num_heads
    keys, values = present_key.repeat_interleave(groups, 1), present_value.repeat_interleave(groups, 1)
    scores = (q.float() @ keys.float().transpose(-1, -2)) * scale
    if softcap > 0:
        scores = softcap * torch.tanh(scores / softcap)
    total = present_key.shape[2]
    key_pos = torch.arange(total)
    allowed = (key_pos[None, None, :] <= query_pos[:, :, None]) & (key_pos[None, None, :] < lengths[:, None, None])
    scores = scores.masked_fill(~allowed[:, None], float("-inf"))
    out = torch.softmax(scores, -1).nan_to_num(0.0) @ values.float()
    out = out.to(query.dtype).transpose(1, 2).reshape(batch, steps, num_heads * head)
    return out, present_key, present_value


def _rotate(x: torch.Tensor, cos_cache: torch.Tensor, sin_cache: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """Rotate-half rotary of ``x [B, heads, S, D]`` at ``positions [B, S]``; dims past the cache's width pass."""
    half = cos_cache.shape[-1]
    cos = torch.cat([cos_cache[positions]] * 2, -1)[:, None].to(x.dtype)  # [B, 1, S, 2*half]
    sin = torch.cat([sin_cache[positions]] * 2, -1)[:, None].to(x.dtype)
    rot, rest = x[..., :2 * half], x[..., 2 * half:]
    turned = torch.cat([-rot[..., half:], rot[..., :half]], -1)
    return torch.cat([rot * cos + turned * sin, rest], -1)


@gqa.register_fake
def _(query, key, value, past_key, past_value, seqlens_k, total_length, cos_cache, sin_cache, num_heads, kv_num_heads,
      scale, softcap):
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

    def group_query_attention(query, key, value, past_key, past_value, seqlens_k, total_length, cos_cache, sin_cache,
                              num_heads: int, kv_num_heads: int, scale: float, softcap: float):
        rotary = cos_cache is not None
        caches = (cos_cache, sin_cache) if rotary else ()
        return op(query, key, value, past_key, past_value, seqlens_k, total_length, *caches, num_heads=num_heads,
                  kv_num_heads=kv_num_heads, scale=scale, softcap=softcap, do_rotary=int(rotary), _num_outputs=3)

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

    def __init__(self, cache, seqlens_k, total_length, rotary: tuple[torch.Tensor, torch.Tensor] | None = None):
        self.cache, self.seqlens_k, self.total_length, self.presents = cache, seqlens_k, total_length, {}
        self.cos_cache, self.sin_cache = rotary or (None, None)

    def __call__(self, module, query, key, value, attention_mask, scaling=None, dropout=0.0, softcap=None,
                 sliding_window=None, **kwargs: Any):
        layer = module.layer_idx
        batch, heads, steps, head = query.shape
        kv_heads = key.shape[1]
        past_key, past_value = self.cache.past[2 * layer], self.cache.past[2 * layer + 1]
        out, present_key, present_value = gqa(
            query.transpose(1, 2).reshape(batch, steps, heads * head), key.transpose(1, 2).reshape(batch, steps, -1),
            value.transpose(1, 2).reshape(batch, steps, -1), past_key, past_value, self.seqlens_k, self.total_length,
            self.cos_cache, self.sin_cache, heads, kv_heads, float(scaling if scaling is not None else head ** -0.5), float(softcap or 0.0))
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


def _attention_layers(model) -> list:
    return [m for m in model.modules() if hasattr(m, "layer_idx") and any(
        n.endswith(("q_proj", "c_attn", "query_key_value", "qkv_proj")) for n, _ in m.named_children())]


def _modeling_modules(model) -> set:
    """The Python modules the attention layers' classes come from (one for a model of one family)."""
    return {sys.modules[type(layer).__module__] for layer in _attention_layers(model)}


def rotary_caches(model, context: int, head_size: int) -> tuple[torch.Tensor, torch.Tensor] | str:
    """``(cos_cache, sin_cache)``, each ``[context, rotary/2]`` in float32, for the op to rotate inside; or why the
    rotary stays where the model computes it."""
    config = model.config
    rope = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    kind = rope.get("rope_type", rope.get("type", "default")) if isinstance(rope, dict) else "default"
    if kind not in STATIC_ROPE:
        return f"its {kind} rope rescales with the sequence length"
    tables = [m for name, m in model.named_modules() if name.endswith("rotary_emb")]
    modules = _modeling_modules(model)
    if not tables or not modules:
        return NO_ROTARY
    if len(tables) != 1 or len(modules) != 1:
        return "not one rotary table"
    module = next(iter(modules))
    if not callable(getattr(module, "apply_rotary_pos_emb", None)) or not callable(getattr(module, "rotate_half", None)):
        return "no apply_rotary_pos_emb in the modeling code"
    try:
        with torch.no_grad():
            cos, sin = tables[0](torch.zeros(1, dtype=torch.float32), torch.arange(context)[None])
    except Exception as exc:  # noqa: BLE001 - any other signature: leave the rotary to the model
        return f"its rotary module did not give a table ({type(exc).__name__})"
    cos, sin = cos[0].float(), sin[0].float()
    half = cos.shape[-1] // 2
    if cos.dim() != 2 or 2 * half != cos.shape[-1] or 2 * half > head_size or not (
            torch.equal(cos[:, :half], cos[:, half:]) and torch.equal(sin[:, :half], sin[:, half:])):
        return "its rotary table is not in the rotate-half layout"
    if half % 8:
        return f"its rotary width of {2 * half} is not a multiple of 16, which ONNX Runtime's op needs"
    return cos[:, :half].contiguous(), sin[:, :half].contiguous()


@contextlib.contextmanager
def rotary_in_attention(model) -> Iterator[None]:
    """Inside the block the model's ``apply_rotary_pos_emb`` hands the query and key through unrotated (the op
    rotates them)."""
    module = next(iter(_modeling_modules(model)))
    before = module.apply_rotary_pos_emb
    module.apply_rotary_pos_emb = lambda q, k, *args, **kwargs: (q, k)
    try:
        yield
    finally:
        module.apply_rotary_pos_emb = before


def fusable(model, context: int) -> str | None:
    """None when :func:`fused_attention` applies to ``model``, else why not."""
    config = model.config
    window = getattr(config, "sliding_window", None)
    if isinstance(window, int) and window < context:
        return f"a sliding window of {window} tokens, shorter than the context of {context}"
    if getattr(config, "use_sinks", False) or family_of(config).attention_sinks:
        return "attention sinks"
    if not _attention_layers(model):
        return "no attention layer with a layer index was found"
    return None
