"""Capture a causal LM's decoder with its KV cache (``torch -> exported``), as a generator runs it.

The decoder (``exporters/kv_decoder.py``) takes the new tokens, the attention mask and the past keys and
values, and gives the logits and the present keys and values. Attention becomes ONNX Runtime's
``GroupQueryAttention``, one op per layer (``exporters/kv_attention.py``), where that op computes what the model
computes, with the rotary embedding inside it where a table of positions holds it; elsewhere attention stays as
transformers writes it, and the note says why. The artifact's InputSpec and output names become the decoder's,
and the decoder's facts (its cache layout, context length, whether attention is fused, the source folder) travel
down the pipeline as a :class:`~infopt.exporters.kv_decoder.KvDecoder` product.
"""

from __future__ import annotations

import copy
import dataclasses
from pathlib import Path
from typing import ClassVar, Literal

from pydantic import Field

from infopt.core.artifact import Artifact
from infopt.core.errors import CaptureError
from infopt.core.pass_api import Pass, PassContext, PassDetails, PassOptions, PassOutcome
from infopt.exporters import kv_attention, kv_decoder, layer_probe
from infopt.quantize.int4_format import conv1d_as_linear
from infopt.runtime.hf_folder import widen


class CaptureKvDecoderOptions(PassOptions):
    SETTINGS: ClassVar[dict[str, str]] = {"attention": "attention"}
    attention: Literal["fused", "unfused"] = Field(
        "fused", description="fused: GroupQueryAttention where it computes the same (the cache one shared buffer); "
                             "unfused: attention as transformers writes it (the cache concatenated each step)")
    conv1d_as_linear: bool = Field(False, description="GPT-2's Conv1D layers as the Linears they are (MatMul in the "
                                                      "graph, which weight-only INT8 takes)")
    stamp: bool = Field(True, description="where every layer is built alike, capture the first two and let onnx_export "
                                          "stamp the second for the rest with their own weights (the cost of the "
                                          "capture and the export then grows with bytes, not with layers)")


class CaptureKvDecoderDetails(PassDetails):
    """The decoder as captured: its cache and how attention was captured."""

    layers: int
    kv_heads: int
    head_size: int
    vocab: int
    context: int
    """the longest sequence the folder generates (the model's positions, at most ``kv_decoder.CONTEXT_DEFAULT``)"""
    fused: bool
    """attention is one GroupQueryAttention op per layer (the cache one buffer each step writes into)"""
    rotary_inside: bool = False
    attention: str = ""
    """how attention was captured, in words"""
    stamped: bool = False
    """captured with the first two layers, the second stamped for the rest by onnx_export"""


def run(artifact: Artifact, options: CaptureKvDecoderOptions, context: PassContext) -> PassOutcome:
    lm = artifact.obj
    widened = _widen(lm)
    if options.conv1d_as_linear:
        lm = copy.deepcopy(lm).eval()
        converted = conv1d_as_linear(lm)
    else:
        converted = []
    length = kv_decoder.context_length(lm.config)
    context.say("capturing the decoder with its KV cache (torch.export)")
    layout = kv_decoder.cache_layout(lm)
    unfused = kv_attention.fusable(lm, length) if options.attention == "fused" else "the recipe asks for it unfused"
    planned = layer_probe.plan(lm, layout.layers) if options.stamp else "the recipe asks for it whole"
    if isinstance(planned, str):
        note, program, fused, rotary = _capture(lm, layout, unfused, length)
        stamp = None
    else:
        probe = dataclasses.replace(layout, layers=layer_probe.PROBE_LAYERS)
        with layer_probe.truncated(lm, planned[0]):
            note, program, fused, rotary = _capture(lm, probe, unfused, length)
        stamp = layer_probe.LayerStamp(lm, planned[0], layout.layers, probe.input_names(), probe.output_names(),
                                       lambda: _capture(lm, layout, unfused, length)[1])
    details = CaptureKvDecoderDetails(layers=layout.layers, kv_heads=layout.kv_heads, head_size=layout.head_size,
                                      vocab=layout.vocab, context=length, fused=fused, rotary_inside=rotary,
                                      attention=note, stamped=stamp is not None)
    notes = [f"{layout.layers} layers, {layout.kv_heads} KV heads of {layout.head_size}; past length dynamic from 0",
             note, *([widened] if widened else []),
             f"captured with its first {layer_probe.PROBE_LAYERS} layers; onnx_export stamps the second for the other "
             f"{layout.layers - layer_probe.PROBE_LAYERS} with their weights" if stamp
             else planned if planned.endswith("captured whole") else f"captured whole: {planned}"]
    if converted:
        notes.append(f"{len(converted)} transformers Conv1D layers as the Linears they are (weight transposed)")
    source = getattr(artifact.obj, "source_dir", None)
    result = artifact.derive("exported", obj=program, output_names=tuple(layout.output_names()),
                             spec=kv_decoder.decoder_spec(layout, length))
    result.products[kv_decoder.KvDecoder] = kv_decoder.KvDecoder(layout, length, fused, lm.config,
                                                                 Path(source) if source else None)
    if stamp:
        result.products[layer_probe.LayerStamp] = stamp
    return PassOutcome(result, True, notes, details)


def _widen(lm) -> str | None:
    """The module's float weights that are not float32 (a bf16 checkpoint's embedding and norms, left as stored
    by an INT4 build) widened in place: the decoder computes in float32. A note saying so, or None."""
    import torch

    narrow = {t.dtype for t in (*lm.parameters(), *lm.buffers()) if t.is_floating_point() and t.dtype != torch.float32}
    if not narrow:
        return None
    widen(lm)  # one tensor at a time, a mapped checkpoint's pages handed back as it goes
    names = ", ".join(sorted(str(d).removeprefix("torch.") for d in narrow))
    return f"the weights still in {names} (those not rounded to INT4) widened to float32: the decoder computes in float32"


def _capture(lm, layout: kv_decoder.CacheLayout, unfused: str | None, length: int):
    """(note, program, fused, rotary inside): the decoder with fused attention where it applies, the rotary
    inside where it can be (else as transformers writes them)."""
    if unfused is None:
        rotary = kv_attention.rotary_caches(lm, length, layout.head_size)
        fused = ("attention as ONNX Runtime's GroupQueryAttention, one op per layer (the cache's concat, grouped "
                 "KV heads and the mask inside")
        if not isinstance(rotary, str):
            try:
                return (f"{fused}, and the rotary embedding from a table of {length} positions)",
                        kv_decoder.capture(lm, layout, fused=True, rotary=rotary), True, True)
            except CaptureError as exc:
                rotary = f"the capture with it inside failed ({exc.what})"
        try:
            return (f"{fused}; the rotary embedding as the model computes it"
                    + (f": {rotary})" if rotary != kv_attention.NO_ROTARY else ")"),
                    kv_decoder.capture(lm, layout, fused=True), True, False)
        except CaptureError as exc:
            unfused = f"the fused capture failed ({exc.what})"
    return f"attention as transformers writes it, unfused: {unfused}", kv_decoder.capture(lm, layout), False, False


PASS = Pass(
    name="capture_kv_decoder",
    consumes="torch",
    produces="exported",
    run=run,
    options=CaptureKvDecoderOptions,
    details=CaptureKvDecoderDetails,
    description="torch.export a causal LM's decoder with its KV cache (GroupQueryAttention where it computes the same)",
)
