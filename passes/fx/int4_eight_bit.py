"""Which of ``quantize_int4``'s layers are kept for 8 bits, and how the module holds them until the export.

With calibration data and text held out of it (``PassContext.choice``), ``int8_share: auto`` is a
:class:`~infopt.quantize.layer_choice.LayerChoice`: the smallest share of the weights whose figures hold the budget,
under ``max_bits_per_weight``. Without data (RTN), it is llama.cpp's mixed strategy
(``layer_choice.mixed_layers``). A fixed ``int8_share`` keeps that share, cut to the cap. With
``eight_bit_in_export``, the kept layers go back in the module as their INT4 layers (:func:`held_in_int4`) and their
float Linears travel to ``onnx_export`` (``Artifact.products[EightBitLayers]``), which writes them in 8 bits.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from torch import nn

from infopt.core.errors import UsageError
from infopt.core.pass_api import PassContext
from infopt.quantize.int4_config import Int4MethodConfig
from infopt.quantize.int4_format import Int4Linear, default_filter, replace_module
from infopt.quantize.layer_choice import (
    EMBEDDING_BITS,
    FIXED_SHARE,
    HEAD_BITS,
    INT8_BITS,
    POOL_SHARE,
    EightBitLayers,
    LayerChoice,
    checked_cap,
    mixed_layers,
    stored_bits,
)
from infopt.quantize.llama_cpp_types import Tensor, q4_k_m_bits
from infopt.quantize.weight_only import layer_groups, plan_layers


@dataclass
class SizeTarget:
    """The size INT4 text generation builds to: the whole model's stored bits per parameter, every table counted
    (``target``: ``--max-bits-per-weight``, else what llama.cpp's ``Q4_K_M`` stores, ``llama_cpp_types.py``), with the
    head and an untied embedding stored as the later passes store them (:data:`HEAD_BITS`, :data:`EMBEDDING_BITS`)."""

    target: float
    given: bool
    """whether the target was asked for (``--max-bits-per-weight``), not Q4_K_M's"""
    parameters: int
    """every table's: the quantized Linears', the head's and an untied embedding's"""
    body_parameters: int
    table_bits: float
    """the head's and the embedding's stored bits"""

    @property
    def body(self) -> float:
        """The quantized Linears' average bits per weight that meets the target."""
        return (self.target * self.parameters - self.table_bits) / max(self.body_parameters, 1)

    def whole(self, body_bits: float) -> float:
        """The whole model's bits per parameter with the quantized Linears at ``body_bits`` on average."""
        return (body_bits * self.body_parameters + self.table_bits) / max(self.parameters, 1)

    def text(self) -> str:
        return (f"--max-bits-per-weight {self.target:g}" if self.given else
                f"llama.cpp Q4_K_M's size, {self.target:.3f} bits per parameter")


def size_target(model, plan, options) -> SizeTarget | None:
    """The :class:`SizeTarget` of a decoder (its output head found by name); None for a model without one."""
    body = [Tensor(name, model.get_submodule(name).weight.numel(), model.get_submodule(name).in_features)
            for name in plan.group_sizes]
    groups = layer_groups(model, list(plan.group_sizes))
    index = {name: i for i, (block, members) in enumerate(groups) if block is not None for name in members}
    body = [dataclasses.replace(t, layer=index.get(t.path)) for t in body]
    heads = [(name, m) for name, m in model.named_modules() if type(m) is nn.Linear and not default_filter(name, m)]
    if len(heads) != 1:
        return None
    tables = [Tensor(heads[0][0], heads[0][1].weight.numel(), heads[0][1].in_features, head=True)]
    embeddings = [(name, m) for name, m in model.named_modules() if type(m) is nn.Embedding
                  and m.weight.shape[1] == heads[0][1].in_features and m.weight is not heads[0][1].weight]
    tables += [Tensor(name, m.weight.numel(), m.weight.shape[1]) for name, m in embeddings]
    everything = body + tables
    table_bits = tables[0].parameters * HEAD_BITS + sum(t.parameters for t in tables[1:]) * EMBEDDING_BITS
    return SizeTarget(options.max_bits_per_weight or q4_k_m_bits(everything), options.max_bits_per_weight is not None,
                      sum(t.parameters for t in everything), sum(t.parameters for t in body), table_bits)


@dataclass
class EightBitPlan:
    """What :func:`int8_plan` decided before any layer is rounded."""

    share: float
    """the most weights kept for 8 bits"""
    chooser: LayerChoice | None
    """picks how many by accuracy (``int8_share: auto`` with text held out to choose on)"""
    int4_bits: float
    """the INT4 layers' stored bits per weight"""
    target: SizeTarget | None
    cap: float | None
    """the quantized Linears' average bits per weight at most"""


def int8_plan(model, config: Int4MethodConfig, options, context: PassContext, uniform: bool) -> EightBitPlan:
    """How many weights may stay for 8 bits, under the size target (:func:`size_target`). A target below what INT4
    itself stores is refused where it was asked for, and keeps every layer in INT4 where it is Q4_K_M's; a fixed
    share is cut to the target."""
    plan = plan_layers(model, config, uniform=uniform)
    sizes = {name: model.get_submodule(name).weight.numel() for name in plan.group_sizes}
    int4_bits = sum(stored_bits(4, plan.group_sizes[n], config.symmetric) * k for n, k in sizes.items()) / \
        max(sum(sizes.values()), 1)
    target = size_target(model, plan, options) if options.int8_share == "auto" or \
        options.max_bits_per_weight is not None else None
    if target is None:
        checked_cap(options.max_bits_per_weight, int4_bits)
        cap = options.max_bits_per_weight
    elif target.given and target.body < int4_bits - 1e-9:
        floor = target.whole(int4_bits)
        raise UsageError(f"--max-bits-per-weight {target.target:g} is below what INT4 stores for this model: "
                         f"{floor:.3f} bits per parameter with every Linear in 4 bits, the head in 8 and an untied "
                         "embedding in 4", fix=f"pass at least {floor:.2f}, or a larger --group-size")
    else:
        cap = max(target.body, int4_bits)
    if not config.needs_data:
        return EightBitPlan(0.0, None, int4_bits, target, cap)
    if options.int8_share == "auto" and context.choice is not None:
        chooser = LayerChoice(context.choice, int4_bits, cap, context.say, None if target is None else target.whole)
        return EightBitPlan(POOL_SHARE, chooser, int4_bits, target, cap)
    share = (FIXED_SHARE if cap is None else 1.0) if options.int8_share == "auto" else options.int8_share
    if cap is not None:
        share = min(share, POOL_SHARE, max(0.0, (cap - int4_bits) / (INT8_BITS - int4_bits)))
    return EightBitPlan(share, None, int4_bits, target, cap)


def held_in_int4(model, result) -> EightBitLayers | None:
    """The layers kept for 8 bits put in the module as their INT4 layers (``result.spare``), their float Linears
    held for ``onnx_export``; None where there are none."""
    floats = {}
    for name in result.for_8bit:
        layer = model.get_submodule(name)
        floats[name] = layer
        replace_module(model, name, Int4Linear(result.spare[name], layer.bias).train(layer.training))
    return EightBitLayers(model, floats) if floats else None


def mixed_rule(model, config: Int4MethodConfig, options, uniform: bool, plan: EightBitPlan) -> list[str]:
    """RTN with ``int8_share: auto``: the layers llama.cpp's mixed strategy keeps for 8 bits
    (``layer_choice.mixed_layers``), unless the size target cannot hold them (then none)."""
    if config.needs_data or options.int8_share != "auto":
        return []
    layers = plan_layers(model, config, uniform=uniform)
    blocks = [members for block, members in layer_groups(model, list(layers.group_sizes)) if block is not None]
    rule = mixed_layers(blocks)
    if plan.cap is not None and rule:
        sizes = {n: model.get_submodule(n).weight.numel() for n in layers.group_sizes}
        share = sum(sizes[n] for n in rule) / max(sum(sizes.values()), 1)
        if plan.int4_bits * (1 - share) + INT8_BITS * share > plan.cap + 1e-9:
            return []
    return rule


def choice_note(chooser: LayerChoice, layers: int, target: SizeTarget | None = None) -> str:
    """What ``int8_share: auto`` chose, in words."""
    found = chooser.to_json()
    tried = "; ".join(f"{r['share']:.0%}: ppl {r['ppl_delta']:+.1%}, top-1 {r['top1']:.3f}" for r in found["rungs"])
    if chooser.max_bits is not None:
        limit = target.text() if target is not None else f"--max-bits-per-weight {chooser.max_bits:g}"
        head = (f"{layers} layers kept for 8 bits, {found['chosen']:.0%} of the weights: those adding the most error to "
                f"their outputs per weight, as many as the size target holds ({limit}); on {found['tokens']} tokens "
                f"of {found['text']} they " + ("hold " if found["held"] else "do not hold ") + found["budget"]
                + (f"; {found['would_pass']['share']:.0%} ({found['would_pass']['model_bits']:g} bits per parameter) "
                   "held it" if found["would_pass"] else ""))
    elif found["held"]:
        head = (f"{layers} layers kept for 8 bits, {found['chosen']:.0%} of the weights: the smallest share whose "
                f"figures on {found['tokens']} tokens of {found['text']} hold {found['budget']} (the budget with a "
                "margin)")
    else:
        head = (f"{layers} layers kept for 8 bits, {found['chosen']:.0%} of the weights, the most tried: no share held "
                f"{found['budget']} on {found['tokens']} tokens of {found['text']}")
    return f"{head} (tried {tried})"
