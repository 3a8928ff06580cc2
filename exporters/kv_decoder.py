"""The decoder of a causal LM as a generator runs it: one graph for the prompt and for each new token,
the KV cache in and out.

Inputs: ``input_ids [batch, sequence_length]``, ``attention_mask [batch, total_sequence_length]``
(the past and the new tokens), and per layer ``past_key_values.<i>.key`` / ``.value``
``[batch, kv_heads, past_sequence_length, head_size]``. Outputs: ``logits [batch, sequence_length,
vocab]`` and per layer ``present.<i>.key`` / ``.value`` (the past with the new tokens appended). The
prompt runs with a past of length 0. Positions are counted from the attention mask inside the graph
(left-padded prompts in a batch get the positions they would have alone), so a runtime feeds no
``position_ids``. These are the names and layouts ONNX Runtime GenAI's decoder-only models use.

The cache's layout (layers, KV heads, head size) is read from one real forward pass of the model, not
from config field names, which differ between families (GPT-2's ``n_layer``, Gemma's ``head_dim``).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from infopt.core.errors import CaptureError, first_line
from infopt.core.inputspec import DimRange, InputSpec
from infopt.core.logs import quiet_third_party
from infopt.exporters import kv_attention

PAST = "past_key_values.{}.{}"
PRESENT = "present.{}.{}"
DIMS = {"batch": "batch_size", "seq": "sequence_length", "total": "total_sequence_length", "past": "past_sequence_length"}
"""the dims' names in the exported graph, as ONNX Runtime GenAI's own models name them"""


@dataclass(frozen=True)
class CacheLayout:
    layers: int
    kv_heads: int
    head_size: int
    vocab: int

    def input_names(self) -> list[str]:
        return ["input_ids", "attention_mask", *(PAST.format(i, kv) for i in range(self.layers) for kv in ("key", "value"))]

    def output_names(self) -> list[str]:
        return ["logits", *(PRESENT.format(i, kv) for i in range(self.layers) for kv in ("key", "value"))]

    def kv_bytes_per_token(self, itemsize: int = 4) -> int:
        """Bytes the cache grows by per token of one sequence (keys and values of every layer)."""
        return 2 * self.layers * self.kv_heads * self.head_size * itemsize


CONTEXT_DEFAULT = 2048
"""the context length a folder generates to when the model's config gives none (and the most it takes, else)"""


@dataclass
class KvDecoder:
    """What the captured decoder carries down a text-generation pipeline (``Artifact.products``): the passes
    after export and the GenAI folder's writer read it."""

    layout: CacheLayout
    context: int
    fused: bool
    """every layer's attention is GroupQueryAttention: the cache can be one buffer each step writes into"""
    config: Any
    """the transformers config of the model"""
    source: Path | None
    """the model's folder (its tokenizer and config)"""


def context_length(config) -> int:
    """The longest sequence the decoder is built for: the config's positions, at most :data:`CONTEXT_DEFAULT`."""
    for key in ("max_position_embeddings", "n_positions", "seq_length"):
        value = getattr(config, key, None)
        if isinstance(value, int) and value > 0:
            return min(value, CONTEXT_DEFAULT)
    return CONTEXT_DEFAULT


def decoder_spec(layout: CacheLayout, context: int) -> InputSpec:
    """The decoder's inputs, with GenAI's dim names and their ranges."""
    cache = f"float32[{DIMS['batch']},{layout.kv_heads},{DIMS['past']},{layout.head_size}]"
    spec = InputSpec.parse([f"input_ids:int64[{DIMS['batch']},{DIMS['seq']}]",
                            f"attention_mask:int64[{DIMS['batch']},{DIMS['total']}]",
                            *(f"{n}:{cache}" for n in layout.input_names()[2:])])
    return spec.with_dims({DIMS["batch"]: DimRange(1, 1, 64), DIMS["seq"]: DimRange(1, 1, context),
                           DIMS["total"]: DimRange(1, min(128, context), context),
                           DIMS["past"]: DimRange(1, min(128, context), context)})


def decoder_outputs(layout: CacheLayout) -> list[tuple[str, str, tuple]]:
    """The decoder's outputs as the manifest lists them: name, dtype, shape."""
    cache = (DIMS["batch"], layout.kv_heads, DIMS["total"], layout.head_size)
    return [("logits", "float32", (DIMS["batch"], DIMS["seq"], layout.vocab)),
            *((name, "float32", cache) for name in layout.output_names()[1:])]


def cache_layout(model) -> CacheLayout:
    """The cache's shape, from one forward pass of two tokens. The pass runs on fake tensors (shapes only,
    nothing computed: at 1.5B parameters in INT4 a real pass dequantized every weight, 7 s), and for real
    where a model's forward needs values."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    def forward():
        with torch.inference_mode(), quiet_third_party():
            return model(input_ids=torch.zeros(1, 2, dtype=torch.long), use_cache=True, return_dict=True)

    try:
        with FakeTensorMode(allow_non_fake_inputs=True):
            return _layout_of(forward())
    except Exception:  # noqa: BLE001 - a data-dependent step in the model's forward: run it for real
        return _layout_of(forward())


def _layout_of(out) -> CacheLayout:
    layers = _layers(_cache_of(out))
    key = layers[0][0]
    return CacheLayout(len(layers), int(key.shape[1]), int(key.shape[3]), int(out.logits.shape[-1]))


def _cache_keyword(model) -> str:
    """What the model's ``forward`` calls the cache: ``cache`` (transformers 5.2x) or ``past_key_values``."""
    import inspect

    return "cache" if "cache" in inspect.signature(type(model).forward).parameters else "past_key_values"


def _cache_of(out):
    """The cache a forward pass returned, under either name."""
    return out["cache"] if "cache" in out else out["past_key_values"]


def _layers(cache) -> list[tuple[Any, Any]]:
    if hasattr(cache, "layers"):
        return [(layer.keys, layer.values) for layer in cache.layers]
    return [(k, v) for k, v in cache]


def decoder_module(model, layout: CacheLayout, fused: bool = False, rotary=None):
    """``(input_ids, attention_mask, *past) -> (logits, *present)`` around a transformers causal LM; with
    ``fused``, each layer's attention is one ``infopt::gqa`` op (``kv_attention.py``), which with ``rotary``
    (``kv_attention.rotary_caches``) also rotates the query and key."""
    import torch
    from transformers import DynamicCache

    keyword = _cache_keyword(model)

    class KvDecoder(torch.nn.Module):
        def __init__(self, lm):
            super().__init__()
            self.lm = lm
            if rotary is not None:
                self.register_buffer("cos_cache", rotary[0])
                self.register_buffer("sin_cache", rotary[1])

        def forward(self, input_ids, attention_mask, *past):
            # positions from the mask: a left-padded prompt's first real token is position 0
            positions = (attention_mask.cumsum(-1) - 1).clamp(min=0)[:, -input_ids.shape[1]:]
            if fused:
                return self._fused(input_ids, attention_mask, positions, past)
            cache = DynamicCache(config=self.lm.config)
            for i in range(layout.layers):
                cache.update(past[2 * i], past[2 * i + 1], i)
            out = self.lm(input_ids=input_ids, attention_mask=attention_mask, position_ids=positions,
                          use_cache=True, return_dict=True, **{keyword: cache})
            return (out["logits"], *(t for pair in _layers(_cache_of(out)) for t in pair))

        def _fused(self, input_ids, attention_mask, positions, past):
            cache = kv_attention.pass_through_cache(self.lm.config, list(past))
            seqlens = (attention_mask.sum(-1) - 1).to(torch.int32)
            total = torch.full((), attention_mask.shape[1], dtype=torch.int32)
            caches = (self.cos_cache, self.sin_cache) if rotary is not None else None
            attention = kv_attention.Attention(cache, seqlens, total, caches)
            unrotated = kv_attention.rotary_in_attention(self.lm) if caches else contextlib.nullcontext()
            with kv_attention.fused_attention(self.lm, attention), unrotated:
                out = self.lm(input_ids=input_ids, attention_mask=attention_mask, position_ids=positions,
                              use_cache=True, return_dict=True, **{keyword: cache})
            return (out["logits"], *(t for i in range(layout.layers) for t in attention.presents[i]))

    return KvDecoder(model).eval()


def capture(model, layout: CacheLayout, fused: bool = False, rotary=None):
    """torch.export of the decoder with every batch and length dim dynamic (a past of 0 included)."""
    import torch
    from torch.export import Dim

    decoder = decoder_module(model, layout, fused, rotary)
    ids = torch.zeros(2, 3, dtype=torch.long)
    mask = torch.ones(2, 7, dtype=torch.long)
    past = [torch.zeros(2, layout.kv_heads, 4, layout.head_size) for _ in range(2 * layout.layers)]
    auto = Dim.DYNAMIC
    shapes = ({0: auto, 1: auto}, {0: auto, 1: auto}, tuple({0: auto, 2: auto} for _ in past))
    try:
        with quiet_third_party(), torch.inference_mode(False), torch.no_grad():
            return torch.export.export(decoder, (ids, mask, *past), dynamic_shapes=shapes, strict=False)
    except Exception as exc:  # noqa: BLE001 - torch.export raises many types
        raise CaptureError(f"the decoder with its KV cache could not be captured: {first_line(exc)}",
                           where=type(model).__name__,
                           fix="report the model's family; build --task logits meanwhile (no cache)") from exc


def name_dims(path, layout: CacheLayout) -> None:
    """Give the exported graph's dim symbols GenAI's names (in place): batch_size, sequence_length,
    total_sequence_length, past_sequence_length."""
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    axes = {"input_ids": ("batch", "seq"), "attention_mask": ("batch", "total"), "logits": ("batch", "seq")}
    for name in layout.input_names()[2:]:
        axes[name] = ("batch", None, "past")
    for name in layout.output_names()[1:]:
        axes[name] = ("batch", None, "total")
    mapping: dict[str, str] = {}
    for value in [*model.graph.input, *model.graph.output]:
        for dim, want in zip(value.type.tensor_type.shape.dim, axes.get(value.name, ())):
            if want and dim.dim_param:
                mapping.setdefault(dim.dim_param, DIMS[want])
    for value in [*model.graph.input, *model.graph.output, *model.graph.value_info]:
        for dim in value.type.tensor_type.shape.dim:
            if dim.dim_param in mapping:
                dim.dim_param = mapping[dim.dim_param]
    onnx.save(model, str(path))
