"""AWQ's input scales folded into the norm before the layers that read them, so the deployed model divides nothing.

An AWQ-GPTQ layer computes ``Q(W diag(s)) (x / s)``: the graph holds a division before it. Where ``x`` is the output of
a norm with a per-feature weight (and bias), ``norm(h) * w + b``, the division is exact in the norm itself:
``w / s`` and ``b / s``. The layers reading that output must share ``s``, as AWQ-GPTQ's do (AWQ's are per layer).
A decoder block's query, key and value projections read the input norm's output, and its
gate and up projections the second norm's, so those divisions go; the output and down projections, whose inputs
come from no such module, keep theirs.

Nothing here knows an architecture. The block runs once on a calibration input with every module watched: a unit
is folded only where its layers read one tensor, that tensor is the single output of a module with a 1-D weight
and no children, and no other module reads it but those holding all of the unit's layers (an MLP passes its input
on). Then the fold is checked: the block runs again, and each of the unit's layers, and the block, must give the
output they gave before within :data:`FOLD_TOLERANCE`, else the fold is undone. A norm
that scales by ``1 + w`` (Gemma's) fails that check and keeps the division.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

FOLD_TOLERANCE = 5e-2
"""the largest relative change of a layer's output that a fold may cause: the rounding of ``w / s`` in the norm's
dtype, against the division's own rounding, moves the real SmolLM2's bf16 outputs by up to 0.9 %; a norm that
scales by ``1 + w`` moves them by far more"""


@dataclass
class Fold:
    """One unit's layers, whose input the norm before them now divides by ``scale``."""

    names: list[str]
    scale: torch.Tensor


def _is_norm(module: nn.Module, features: int) -> bool:
    """A leaf module whose parameters are a weight of ``features`` values and at most a bias of as many."""
    if next(module.children(), None) is not None:
        return False
    params = dict(module.named_parameters(recurse=False))
    weight, bias = params.get("weight"), params.get("bias")
    if weight is None or weight.dim() != 1 or weight.numel() != features or set(params) - {"weight", "bias"}:
        return False
    return bias is None or bias.shape == weight.shape


def _watch(block: nn.Module):
    """Hooks recording what each module of ``block`` is given and gives on one run."""
    given: dict[nn.Module, list] = {}
    gave: dict[nn.Module, list] = {}

    def before(module, args):
        given.setdefault(module, []).append(args[0] if args and isinstance(args[0], torch.Tensor) else None)

    def after(module, _args, output):
        if isinstance(output, (tuple, list)) and output and module is block:
            output = output[0]  # a decoder block's hidden states
        gave.setdefault(module, []).append(output if isinstance(output, torch.Tensor) else None)

    handles = []
    for module in block.modules():
        handles.append(module.register_forward_pre_hook(before))
        handles.append(module.register_forward_hook(after))
    return given, gave, handles


def _run(block: nn.Module, inputs) -> tuple[dict, dict]:
    args, kwargs = inputs
    given, gave, handles = _watch(block)
    try:
        with torch.no_grad():
            block(*args, **kwargs)
    finally:
        for handle in handles:
            handle.remove()
    return given, gave


def _candidate(unit: list[str], members: dict[str, nn.Module], given: dict, gave: dict) -> tuple[nn.Module, torch.Tensor] | None:
    """The norm whose output ``unit``'s layers alone read, and their common input scale; None where there is none."""
    layers = [members[name] for name in unit]
    scales = [getattr(getattr(layer, "packed", layer), "input_scale", None) for layer in layers]
    if any(s is None for s in scales) or any(not torch.equal(s, scales[0]) for s in scales[1:]):
        return None
    inputs = [given.get(layer, []) for layer in layers]
    if any(len(seen) != 1 or seen[0] is None for seen in inputs) or any(seen[0] is not inputs[0][0] for seen in inputs):
        return None
    x = inputs[0][0]
    producers = [m for m, outputs in gave.items() if any(out is x for out in outputs)]
    if len(producers) != 1 or len(gave[producers[0]]) != 1 or not _is_norm(producers[0], x.shape[-1]):
        return None
    readers = {m for m, seen in given.items() if any(t is x for t in seen)}
    passing = {m for m in readers if all(any(inner is layer for inner in m.modules()) for layer in layers)}
    if not set(layers) <= readers or readers - set(layers) - passing:
        return None  # another module reads the norm's output (one holding all of the unit's layers passes it on)
    return producers[0], scales[0]


def _divide(norm: nn.Module, scale: torch.Tensor) -> dict[str, torch.Tensor]:
    """``norm``'s weight and bias divided by ``scale`` in place; their values before, to undo it."""
    saved = {}
    for name in ("weight", "bias"):
        param = getattr(norm, name, None)
        if param is not None:
            saved[name] = param.data
            param.data = (param.detach().float() / scale.to(param.device, torch.float32)).to(param.dtype)
    return saved


def _relative_change(before: torch.Tensor, after: torch.Tensor) -> float:
    reference = float(before.float().norm())
    return float((after.float() - before.float()).norm()) / max(reference, 1e-12)


def fold_input_scales(block: nn.Module, members: dict[str, nn.Module], units: list[list[str]], inputs) -> list[Fold]:
    """Fold each unit's input scale into the norm before it where that is exact (see the module's docstring).

    ``members``: each layer's name and its module in ``block`` (an INT4 layer, or a wrapper with ``.packed``);
    ``inputs``: one calibration input of the block, ``(args, kwargs)``. One unit is folded and checked at a time;
    a fold whose check fails is undone. Returns the folds kept."""
    given, gave = _run(block, inputs)
    kept = []
    for unit in units:
        found = _candidate(unit, members, given, gave)
        if found is None:
            continue
        norm, scale = found
        layers = [getattr(members[n], "packed", members[n]) for n in unit]
        saved = _divide(norm, scale)
        for layer in layers:
            layer.input_scale = None
        _, now = _run(block, inputs)
        changes = [_relative_change(gave[members[n]][0], now[members[n]][0]) for n in unit]
        changes.append(_relative_change(gave[block][0], now[block][0]))
        if max(changes) <= FOLD_TOLERANCE:
            kept.append(Fold(unit, scale))
            continue
        for name, value in saved.items():
            getattr(norm, name).data = value
        for layer in layers:
            layer.input_scale = scale
    return kept
