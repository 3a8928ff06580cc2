"""Which of ``quantize_int4``'s layers are kept for 8 bits, and how the module holds them until the export.

With calibration data and text held out of it (``PassContext.choice``), ``int8_share: auto`` is a
:class:`~infopt.quantize.layer_choice.LayerChoice`: the smallest share of the weights whose figures hold the budget,
under ``max_bits_per_weight``. Without data (RTN), it is llama.cpp's mixed strategy
(``layer_choice.mixed_layers``). A fixed ``int8_share`` keeps that share, cut to the cap. With
``eight_bit_in_export``, the kept layers go back in the module as their INT4 layers (:func:`held_in_int4`) and their
float Linears travel to ``onnx_export`` (``Artifact.products[EightBitLayers]``), which writes them in 8 bits.
"""

from __future__ import annotations

from infopt.core.pass_api import PassContext
from infopt.quantize.int4_config import Int4MethodConfig
from infopt.quantize.int4_format import Int4Linear, replace_module
from infopt.quantize.layer_choice import (
    FIXED_SHARE,
    INT8_BITS,
    POOL_SHARE,
    EightBitLayers,
    LayerChoice,
    checked_cap,
    mixed_layers,
    stored_bits,
)
from infopt.quantize.weight_only import layer_groups, plan_layers


def int8_plan(model, config: Int4MethodConfig, options, context: PassContext,
              uniform: bool) -> tuple[float, LayerChoice | None, float]:
    """``(share, chooser, int4_bits)``: the most weights kept for 8 bits, the :class:`LayerChoice` that picks how
    many by accuracy (``int8_share: auto`` with text held out to choose on), and the INT4 layers' stored bits per
    weight. A cap below INT4's own bits is refused; a fixed share is cut to the cap."""
    plan = plan_layers(model, config, uniform=uniform)
    sizes = {name: model.get_submodule(name).weight.numel() for name in plan.group_sizes}
    int4_bits = sum(stored_bits(4, plan.group_sizes[n], config.symmetric) * k for n, k in sizes.items()) / \
        max(sum(sizes.values()), 1)
    checked_cap(options.max_bits_per_weight, int4_bits)
    if not config.needs_data:
        return 0.0, None, int4_bits
    if options.int8_share == "auto" and context.choice is not None:
        chooser = LayerChoice(context.choice, int4_bits, options.max_bits_per_weight, context.say)
        return POOL_SHARE, chooser, int4_bits
    share = FIXED_SHARE if options.int8_share == "auto" else options.int8_share
    if options.max_bits_per_weight is not None:
        share = min(share, max(0.0, (options.max_bits_per_weight - int4_bits) / (INT8_BITS - int4_bits)))
    return share, None, int4_bits


def held_in_int4(model, result) -> EightBitLayers | None:
    """The layers kept for 8 bits put in the module as their INT4 layers (``result.spare``), their float Linears
    held for ``onnx_export``; None where there are none."""
    floats = {}
    for name in result.for_8bit:
        layer = model.get_submodule(name)
        floats[name] = layer
        replace_module(model, name, Int4Linear(result.spare[name], layer.bias).train(layer.training))
    return EightBitLayers(model, floats) if floats else None


def mixed_rule(model, config: Int4MethodConfig, options, uniform: bool, int4_bits: float) -> list[str]:
    """RTN with ``int8_share: auto``: the layers llama.cpp's mixed strategy keeps for 8 bits
    (``layer_choice.mixed_layers``), unless ``max_bits_per_weight`` cannot hold them (then none)."""
    if config.needs_data or options.int8_share != "auto":
        return []
    plan = plan_layers(model, config, uniform=uniform)
    blocks = [members for block, members in layer_groups(model, list(plan.group_sizes)) if block is not None]
    rule = mixed_layers(blocks)
    if options.max_bits_per_weight is not None and rule:
        sizes = {n: model.get_submodule(n).weight.numel() for n in plan.group_sizes}
        share = sum(sizes[n] for n in rule) / max(sum(sizes.values()), 1)
        if int4_bits * (1 - share) + INT8_BITS * share > options.max_bits_per_weight:
            return []
    return rule


def choice_note(chooser: LayerChoice, layers: int) -> str:
    """What ``int8_share: auto`` chose, in words."""
    found = chooser.to_json()
    tried = "; ".join(f"{r['share']:.0%}: ppl {r['ppl_delta']:+.1%}, top-1 {r['top1']:.3f}" for r in found["rungs"])
    head = (f"{layers} layers kept for 8 bits, {found['chosen']:.0%} of the weights: the smallest share whose figures on "
            f"{found['tokens']} tokens of {found['text']} hold {found['budget']} (the budget with a margin)"
            if found["held"] else
            f"{layers} layers kept for 8 bits, {found['chosen']:.0%} of the weights, the most "
            + (f"--max-bits-per-weight {chooser.max_bits:g} allows" if chooser.max_bits is not None else "tried")
            + f": no share held {found['budget']} on {found['tokens']} tokens of {found['text']}"
            + (f"; {found['would_pass']['share']:.0%} ({found['would_pass']['bits']:g} bits per weight) held it"
               if found["would_pass"] else ""))
    return f"{head} (tried {tried})"
