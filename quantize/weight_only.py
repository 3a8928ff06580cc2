"""INT4 weight-only quantization of a model's Linear layers: one config, one verb.

``quantize_int4(model, GPTQConfig(), batches)`` replaces every quantizable
``nn.Linear`` (found by type and a filter, see :func:`quantizable_linears`) with an
:class:`Int4Linear` in infopt's packed format. :func:`calibrate_int4` yields the packed weights
(a serializable result) and :func:`apply_int4` applies them (deterministic); ``quantize_int4``
does both in one pass over the model, without a second copy of it.

The method is the config's class (``RTNConfig``, ``GPTQConfig``, ``AWQConfig``, or the flat
``Int4Config`` that names one); its handler (``quantize/int4_methods.py``) says what statistic to
collect and how to quantize a layer from it. Nothing here names a method.

Calibration streams, layer group by layer group: the Linears of one transformer block (the
children of the model's largest ``nn.ModuleList`` of Linears), then all the others. For each
group the calibration batches run through a working copy of the model whose earlier groups are
already quantized (so later layers see, and GPTQ compensates, the earlier rounding), hooks on the
group's Linears fold each batch into a per-layer statistic (GPTQ's Hessian, AWQ's activation
sample). The first block's inputs are caught once, from a forward that stops there; each block then runs
alone on its inputs (for the statistics, then again quantized, to give the next block its inputs), so
calibration costs one pass over each block, growing linearly with the depth, not with its square as
running the model up to each block did. Only the current group's statistics and one set of block inputs
are held, never every layer's activations.
"""

from __future__ import annotations

import copy
import dataclasses
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Sequence

import torch
from torch import nn

from infopt.core.errors import UsageError
from infopt.core.memory import drop_file_pages, file_mappings
from infopt.quantize import awq, awq_gptq, gptq, rtn  # noqa: F401 - each registers its method's handler
from infopt.quantize.calib_forwards import block_inputs, block_outputs, chained, collect, collect_block
from infopt.quantize.int4_config import Int4Config, Int4MethodConfig, as_method_config
from infopt.quantize.int4_format import (
    Int4Linear,
    Int4Weight,
    LinearFilter,
    check_group_size,
    default_filter,
    dequantize_int4,
    quantizable_linears,
    replace_module,
)
from infopt.quantize.int4_methods import Int4Method, handler_for
from infopt.quantize.scale_folding import fold_input_scales
from infopt.runtime.memory_estimate import available_bytes


@dataclass
class LayerResult:
    name: str
    shape: tuple[int, int]
    error: float | None
    """``tr(E H E^T) / tr(W H W^T)`` on the calibration data; None for RTN without data."""
    seconds: float
    alpha: float | None = None
    act_order: bool = False
    group_size: int | None = None
    output_error: float | None = None
    """``tr(E H E^T)``: the error added to the layer's output (its stack's, for layers rounded together)"""

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass
class Int4Result:
    """What :func:`calibrate_int4` found: the packed weights by layer path, and per-layer figures."""

    config: Int4MethodConfig
    weights: dict[str, Int4Weight]
    layers: list[LayerResult] = field(default_factory=list)
    rows: int = 0
    """Calibration rows (tokens) the busiest layer saw."""
    kept: dict[str, str] = field(default_factory=dict)
    """Linears left in float, with the reason."""
    for_8bit: list[str] = field(default_factory=list)
    """those of ``kept`` left in float for 8 bits downstream (``int8_share``)"""
    spare: dict[str, Int4Weight] = field(default_factory=dict)
    """the INT4 weights of ``for_8bit``'s layers: a graph with every layer alike holds them until it is written
    (``onnx_export`` stamps one layer for all, then lowers these to 8 bits from their float weights)"""
    folded: list[str] = field(default_factory=list)
    """layers whose input scale went into the norm before them (``fold_scales``): they divide nothing"""


FALLBACK_GROUP_SIZES = (128, 64, 32)
"""Group sizes tried, largest first and none above the one asked for, for a layer that the
configured group size does not divide (Hugging Face models' widths are multiples of 128; a
classifier head's often are not)."""


CHECKPOINT_PACK = 8
"""GPTQ and AWQ checkpoints pack eight 4-bit codes or zero points per int32 along a layer's inputs and outputs"""


@dataclass
class LayerPlan:
    """Which Linears become INT4 and with what group size, and why the others stay in float."""

    group_sizes: dict[str, int]
    kept: dict[str, str]
    """layer path -> why it stays in the activation precision"""


def group_sizes_tried(wanted: int) -> tuple[int, ...]:
    """``wanted``, then the sizes of :data:`FALLBACK_GROUP_SIZES` below it, largest first."""
    return (wanted, *(g for g in FALLBACK_GROUP_SIZES if g < wanted))


def group_size_for(in_features: int, wanted: int) -> int | None:
    """``wanted`` if it divides ``in_features``, else the largest of :data:`FALLBACK_GROUP_SIZES`
    below it that does, else None (the layer stays unquantized)."""
    for size in group_sizes_tried(wanted):
        if not check_group_size("", in_features, size):
            return size
    return None


def plan_layers(model: nn.Module, config: Int4MethodConfig, keep: LinearFilter = default_filter,
                uniform: bool = False) -> LayerPlan:
    """The Linears to quantize with their group sizes; a clear error when the model has none at all.

    Each layer gets the largest size of the group-size rule that divides its input features; with
    ``uniform`` (a checkpoint whose config holds one group size), every quantized layer gets the
    largest size that divides them all (SmolLM-135M's 576-wide layers: 64 for the whole model), and a
    layer whose inputs or outputs are not a multiple of :data:`CHECKPOINT_PACK` stays in float."""
    plan = LayerPlan({}, {})
    linears = list(quantizable_linears(model, keep))
    for name, module in linears:
        size = group_size_for(module.in_features, config.group_size)
        if uniform and (module.out_features % CHECKPOINT_PACK or module.in_features % CHECKPOINT_PACK):
            plan.kept[name] = (f"{module.in_features} inputs, {module.out_features} outputs: the 4-bit checkpoint's "
                               f"layout packs {CHECKPOINT_PACK} per int32 along both (a classifier head's labels seldom are)")
        elif size is None:
            tried = group_sizes_tried(config.group_size)
            plan.kept[name] = (f"{module.in_features} input features: no group size of {', '.join(map(str, tried))} "
                               "divides them")
        else:
            plan.group_sizes[name] = size
    if uniform and plan.group_sizes:
        widths = {model.get_submodule(name).in_features for name in plan.group_sizes}
        common = next((size for size in group_sizes_tried(config.group_size)
                       if all(width % size == 0 for width in widths)), None)
        if common is not None:  # else the layers keep their own sizes, and the checkpoint says it cannot hold them
            plan.group_sizes = dict.fromkeys(plan.group_sizes, common)
    if not linears:
        kinds = sorted({type(m).__name__ for m in model.modules() if next(m.children(), None) is None})
        raise UsageError("the model has no nn.Linear layers to quantize to INT4",
                         where=f"layer types found: {', '.join(kinds[:12]) or 'none'}",
                         fix="INT4 weight-only quantization applies to Linear layers (transformers); "
                             "use --int8 for convolutional models")
    return plan


def layer_groups(model: nn.Module, names: Sequence[str]) -> list[tuple[nn.Module | None, list[str]]]:
    """The Linears by block, in block order, then the rest (block ``None``)."""
    def inside(path: str) -> int:
        return sum(1 for n in names if n.startswith(path + "."))

    lists = [(path, m) for path, m in model.named_modules() if isinstance(m, nn.ModuleList)]
    best = max(lists, key=lambda item: inside(item[0]), default=None)
    groups: list[tuple[nn.Module | None, list[str]]] = []
    placed: set[str] = set()
    if best is not None and inside(best[0]):
        for index, block in enumerate(best[1]):
            members = [n for n in names if n.startswith(f"{best[0]}.{index}.")]
            if members:
                groups.append((block, members))
                placed.update(members)
    rest = [n for n in names if n not in placed]
    if rest:
        groups.append((None, rest))
    return groups


def calibrate_int4(model: nn.Module, config: Int4MethodConfig | Int4Config,
                   batches: Iterable[Sequence[torch.Tensor]] | None = None, *,
                   keep: LinearFilter = default_filter, progress: Callable[[str], None] | None = None,
                   inplace: bool = False, uniform_group_size: bool = False,
                   masks: Sequence[torch.Tensor | None] | None = None, int8_share: float = 0.0,
                   choose: Callable | None = None, for_8bit: Sequence[str] = (),
                   fold_scales: bool = False) -> Int4Result:
    """Packed INT4 weights for every quantizable Linear of ``model``.

    ``batches`` are tuples of input tensors in the model's argument order; a method that
    calibrates (GPTQ, AWQ) needs them, RTN does not. ``masks``, one per batch, mark its real
    positions (``[batch, seq]``, true where a token is, an ``attention_mask``): padded positions
    never reach the statistics. ``model`` is left unchanged (the work is done on a copy) unless
    ``inplace``: then it ends with its Linears as :class:`Int4Linear`, on its own device.

    ``int8_share``: the layers that add the most error to their outputs (``tr(E H E^T)``), up to this share of
    the quantized weights, stay in float in ``result.kept``, for 8 bits downstream. Only their float weights are
    held while the rest is rounded: at most this share of the model's. ``choose`` (a ``layer_choice.LayerChoice``)
    then says how many of them, the largest error per weight first, stay in float (``int8_share`` is then the most
    it may choose). ``for_8bit``: layers chosen beforehand (``layer_choice.mixed_layers``), for RTN, left in float
    for 8 bits the same way. Their INT4 weights are in ``result.spare`` either way.

    ``fold_scales`` (in place only): a method's input scales go into the norm before the layers where that is exact
    (``scale_folding.py``), and those layers divide nothing; the float Linears held for 8 bits are scaled to match.
    """
    config = as_method_config(config)
    method = handler_for(config)
    plan = plan_layers(model, config, keep, uniform=uniform_group_size)
    names = list(plan.group_sizes)
    result = Int4Result(config, {}, kept=dict(plan.kept))
    if not names:
        return result
    started = time.perf_counter()
    # in place, a layer's stored weights are not read again once rounded: where they map a checkpoint's file, their
    # pages go back to the kernel (an 8B bf16 checkpoint's are 14 GB, all resident after the reference's run)
    mappings = file_mappings() if inplace else []
    if method.statistic is None:
        for name in names:
            if progress:
                progress(f"layer {len(result.layers) + 1}/{len(names)} {name}{eta(started, len(result.layers), len(names))}")
            layer = model.get_submodule(name)
            _record(result, [name], [layer], None, config.model_copy(update={"group_size": plan.group_sizes[name]}),
                    method)
            drop_file_pages(layer.weight, mappings)
        for name in (n for n in for_8bit if n in result.weights):
            result.spare[name] = result.weights.pop(name)
            result.for_8bit.append(name)
            result.kept[name] = "kept for 8 bits: among the layers llama.cpp's mixed strategy finds most sensitive"
        result.layers = [row for row in result.layers if row.name in result.weights]
        if inplace:
            apply_int4(model, result.weights)
        return result
    batches = list(batches or [])
    if not batches:
        raise UsageError(f"INT4 {method.name.upper()} needs calibration data",
                         fix="pass --calib PATH (a text file with --tokenizer, or samples), or --int4-method rtn")
    home, training = next(model.parameters()).device, model.training
    device = config.device if config.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    work = (model if inplace else copy.deepcopy(model)).eval().to(device)
    batches = [tuple(t.to(device) for t in batch) for batch in batches]
    masks = [None if m is None else m.to(device).bool() for m in masks] if masks is not None else [None] * len(batches)
    groups = layer_groups(work, names)
    keeper = _Int8Keeper(int8_share, sum(work.get_submodule(n).weight.numel() for n in names))
    # the choice runs the whole rounded model several times: its layers then stay dequantized where that fits
    dense = choose is not None and _dense_fits(work, names)
    inputs = None  # each batch's (args, kwargs) at the current block's entry, once the first block caught them
    for number, (block, members) in enumerate(groups, 1):
        stats = {n: method.statistic(config, work.get_submodule(n).in_features) for n in members}
        if progress:
            progress(f"group {number}/{len(groups)}: collecting {method.name.upper()} statistics")
        if block is not None and inputs is None and number == 1:
            blocks = [b for b, _ in groups if b is not None]
            inputs = block_inputs(work, block, batches) if chained(work, blocks, batches[0]) else None
        if block is not None and inputs is not None:
            result.rows = max(result.rows, collect_block(work, block, members, stats, inputs, masks))
        else:
            result.rows = max(result.rows, collect(work, block, members, stats, batches, masks))
        units = _units(members, stats, plan.group_sizes, method)
        for unit in units:
            if progress:
                progress(f"layer {len(result.layers) + 1}/{len(names)} {' + '.join(unit)}"
                         f"{eta(started, len(result.layers), len(names))}")
            layers = [work.get_submodule(name) for name in unit]
            if stats[unit[0]].rows == 0:
                raise UsageError(f"layer {unit[0]} saw no calibration rows", where=f"layer {unit[0]}",
                                 fix="the calibration data must run through the layer; check the inputs reach it")
            weights = _record(result, unit, layers, stats[unit[0]],
                              config.model_copy(update={"group_size": plan.group_sizes[unit[0]]}), method)
            keeper.offer(result.layers[-1].output_error, unit, layers)
            for name, layer, weight in zip(unit, layers, weights):
                # while calibration runs the layer again, its rounded weight is held dequantized (an Int4Linear
                # dequantizes on every call: half the block's time at 128 passages)
                replace_module(work, name, Rounded(Int4Linear(weight, layer.bias).to(device)))
                drop_file_pages(layer.weight, mappings)
        if fold_scales and inplace and config.input_scales and block is not None and inputs is not None:
            _fold(work, block, members, units, inputs[0], result, keeper)
        if block is not None and inputs is not None:
            inputs = block_outputs(block, inputs)  # the next block's inputs: this one's, quantized, on them
            if not dense:
                _packed(work, members)
    count = None
    if choose is not None and keeper.held:
        use = keeper.in_use(work)
        count = choose(work, [sum(layer.weight.numel() for layer in ls) for _, _, ls in keeper.held], keeper.total,
                       use)
        use(0)
    _packed(work, names)
    keeper.restore(work, result, count)
    if inplace:
        work.to(home).train(training)
    return result


def _fold(work: nn.Module, block: nn.Module, members: list[str], units: list[list[str]], inputs,
          result: Int4Result, keeper: _Int8Keeper) -> None:
    """The block's input scales folded into its norms where exact; the weights and held float Linears to match."""
    for fold in fold_input_scales(block, {n: work.get_submodule(n) for n in members}, units, inputs):
        for name in fold.names:
            result.weights[name] = dataclasses.replace(result.weights[name], input_scale=None)
            result.folded.append(name)
        keeper.scale_inputs(fold.names, fold.scale)


class _Int8Keeper:
    """The units with the largest output errors per weight so far, up to ``share`` of the ``total`` weights, their
    float Linears held."""

    def __init__(self, share: float, total: int):
        self.total = total
        self.budget = share * total
        self.held: list[tuple[float, list[str], list[nn.Module]]] = []

    def offer(self, score: float | None, names: list[str], layers: list[nn.Module]) -> None:
        size = sum(layer.weight.numel() for layer in layers)
        if score is None or size > self.budget:
            return
        self.held.append((score, names, layers))
        # the most error per weight first, a knapsack's greedy order (benchmarks/results/real_llm.md)
        self.held.sort(key=lambda item: -item[0] / sum(layer.weight.numel() for layer in item[2]))
        while sum(layer.weight.numel() for _, _, ls in self.held for layer in ls) > self.budget:
            self.held.pop()

    def scale_inputs(self, names: list[str], scale: torch.Tensor) -> None:
        """The held float Linears of ``names`` made to read inputs divided by ``scale``: ``W diag(scale)``."""
        for _, held_names, layers in self.held:
            if held_names == names:
                for layer in layers:
                    weight = layer.weight.detach()
                    layer.weight = nn.Parameter((weight.float() * scale.to(weight.device)).to(weight.dtype),
                                                requires_grad=False)

    def in_use(self, work: nn.Module) -> Callable[[int], None]:
        """A function putting the first ``k`` held units (most error per weight first) in float in ``work``, the others in
        their INT4 layers (as ``work`` holds them when this is called)."""
        packed = {name: work.get_submodule(name) for _, names, _ in self.held for name in names}

        def use(k: int) -> None:
            for index, (_, names, layers) in enumerate(self.held):
                for name, layer in zip(names, layers):
                    replace_module(work, name, layer if index < k else packed[name])
        return use

    def restore(self, work: nn.Module, result: Int4Result, count: int | None = None) -> None:
        """The first ``count`` held units (all: None) back in float in ``work``, for 8 bits downstream."""
        chosen = self.held if count is None else self.held[:count]
        within = sum(layer.weight.numel() for _, _, ls in chosen for layer in ls) / max(self.total, 1)
        for score, names, layers in chosen:
            for name, layer in zip(names, layers):
                replace_module(work, name, layer)
                result.spare[name] = result.weights.pop(name)
                result.for_8bit.append(name)
                result.kept[name] = (f"kept for 8 bits: its output error {score:.3g} among the largest per weight, "
                                     f"within {within:.0%} of the weights")
        result.layers = [row for row in result.layers if row.name in result.weights]
        self.held = []


def eta(started: float, done: int, total: int) -> str:
    """``, about 40 s left``: the time the remaining items take at the pace of those done (nothing before one is)."""
    if not done:
        return ""
    left = (time.perf_counter() - started) / done * (total - done)
    return f", about {left:.0f} s left" if left < 120 else f", about {left / 60:.0f} min left"


class Rounded(nn.Module):
    """An :class:`Int4Linear` (``packed``) whose weight is dequantized once per input dtype while calibration runs
    it, where the layer itself unpacks it on every call; the same products (``int4_linear_torch``'s)."""

    def __init__(self, packed: Int4Linear):
        super().__init__()
        self.packed = packed
        self.dense: dict[torch.dtype, torch.Tensor] = {}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        p = self.packed
        if x.dtype not in self.dense:
            self.dense = {x.dtype: dequantize_int4(p.qweight, p.scales.to(x.dtype), p.zeros, p.g_idx, p.group_size)}
        if p.input_scale is not None:
            x = x / p.input_scale.to(x.dtype)
        return nn.functional.linear(x, self.dense[x.dtype], None if p.bias is None else p.bias.to(x.dtype))


DENSE_SHARE = 0.5
"""the share of the memory still available that the rounded layers' dequantized weights may take while the INT4
choice runs the model: each run would otherwise dequantize every layer once a batch"""


def _dense_fits(work: nn.Module, names: Sequence[str]) -> bool:
    """Whether ``names``' weights, dequantized in the model's dtype, fit :data:`DENSE_SHARE` of the memory left."""
    layers = [work.get_submodule(n) for n in names]
    needed = sum(layer.weight.numel() * layer.weight.element_size() for layer in layers)
    left = available_bytes()
    return left is None or needed <= DENSE_SHARE * left


def _packed(work: nn.Module, names: Sequence[str]) -> None:
    """Each of ``names`` still :class:`Rounded` in ``work`` replaced by its :class:`Int4Linear`."""
    for name in names:
        layer = work.get_submodule(name)
        if isinstance(layer, Rounded):
            replace_module(work, name, layer.packed)


def _units(members: list[str], stats: dict, group_sizes: dict[str, int], method: Int4Method) -> list[list[str]]:
    """The members in the order they are quantized, those that read one input (one statistic: a block's query,
    key and value projections, its gate and up) together where the method rounds each output row on its own."""
    units: dict[tuple, list[str]] = {}
    for name in members:
        key = (id(stats[name]), group_sizes[name]) if method.stacks else (name,)
        units.setdefault(key, []).append(name)
    return list(units.values())


def _record(result: Int4Result, names: list[str], layers: list[nn.Linear], statistic, config: Int4MethodConfig,
            method: Int4Method) -> list[Int4Weight]:
    """Quantize ``layers`` with ``method`` as one weight (their rows stacked: they share ``statistic``), add each
    to ``result`` (the stack's error and time shared among them), and return their weights."""
    start = time.perf_counter()
    stacked = torch.cat([layer.weight.detach().float() for layer in layers]) if len(layers) > 1 else \
        layers[0].weight.detach().float()
    done = method.quantize(stacked, statistic, config)
    weights = done.weight.split_rows([layer.out_features for layer in layers])
    seconds = (time.perf_counter() - start) / len(layers)
    for name, layer, weight in zip(names, layers, weights):
        result.weights[name] = weight
        result.layers.append(LayerResult(name, tuple(layer.weight.shape), done.error, seconds,
                                         alpha=done.alpha, act_order=getattr(config, "act_order", False),
                                         group_size=config.group_size, output_error=done.output_error))
    return weights


def apply_int4(model: nn.Module, weights: dict[str, Int4Weight]) -> nn.Module:
    """Replace each named Linear of ``model`` (in place) by an :class:`Int4Linear` holding its weight, in the
    Linear's training mode (layers alike but for it would not be stamped as alike)."""
    for name, packed in weights.items():
        layer = model.get_submodule(name)
        replace_module(model, name, Int4Linear(packed, layer.bias).train(layer.training))
    return model


def quantize_int4(model: nn.Module, config: Int4MethodConfig | Int4Config | None = None,
                  batches: Iterable[Sequence[torch.Tensor]] | None = None, *, keep: LinearFilter = default_filter,
                  progress: Callable[[str], None] | None = None, uniform_group_size: bool = False,
                  masks: Sequence[torch.Tensor | None] | None = None, int8_share: float = 0.0,
                  choose: Callable | None = None, for_8bit: Sequence[str] = (),
                  fold_scales: bool = False) -> Int4Result:
    """Calibrate in place: ``model`` ends with its quantizable Linears as INT4 (one group size for all
    with ``uniform_group_size``); ``masks``, ``int8_share``, ``choose``, ``for_8bit`` and ``fold_scales`` as
    :func:`calibrate_int4` takes them."""
    return calibrate_int4(model, as_method_config(config), batches, keep=keep, progress=progress, inplace=True,
                          uniform_group_size=uniform_group_size, masks=masks, int8_share=int8_share, choose=choose,
                          for_8bit=for_8bit, fold_scales=fold_scales)
