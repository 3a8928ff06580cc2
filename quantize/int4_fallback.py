"""INT4's sensitivity fallback: the INT4 layers that cost the most accuracy back in float until a drift budget holds
(the logits builds' ``fallback_budget``, as ``quantize/sensitivity.py`` does for INT8)."""

from __future__ import annotations

import copy
from typing import Any, Callable

import torch
from torch import nn

from infopt.quantize.int4_format import Int4Linear, replace_module
from infopt.quantize.sensitivity import output_drift
from infopt.quantize.weight_only import Int4Result


def _outputs(model: nn.Module, batches) -> list:
    """The model's outputs on ``batches`` (tuples of tensors), each output concatenated over them."""
    import numpy as np
    from torch.utils._pytree import tree_leaves

    with torch.no_grad():
        runs = [[t.detach().float().cpu().numpy() for t in tree_leaves(model(*b)) if isinstance(t, torch.Tensor)]
                for b in batches]
    return [np.concatenate([r[i] for r in runs]) for i in range(len(runs[0]))]


def fall_back_to_budget(original: nn.Module, quantized: nn.Module, result: Int4Result, batches, budget,
                        progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Put the INT4 layers that cost the most accuracy back in float until ``budget`` holds.

    Each layer's sensitivity is the output drift of ``original`` with that layer alone in INT4 (one
    forward per layer on ``batches``); the most sensitive are restored one at a time from
    ``original`` into ``quantized`` (in place) until the whole model meets the budget, the way the
    INT8 fallback does (``quantize/sensitivity.py``). Returns what it measured and restored."""

    reference = _outputs(original, batches)
    drift = output_drift(reference, _outputs(quantized, batches))
    record: dict[str, Any] = {"budget": str(budget), "before": drift, "restored": [], "after": drift}
    if budget.holds(drift) or not result.weights:
        return record
    badness = {}
    for number, name in enumerate(result.weights, 1):
        if progress:
            progress(f"INT4 sensitivity {number}/{len(result.weights)}: {name}")
        probe = copy.deepcopy(original)
        layer = probe.get_submodule(name)
        replace_module(probe, name, Int4Linear(result.weights[name], layer.bias))
        badness[name] = budget.badness(output_drift(reference, _outputs(probe, batches)))
    for name in sorted(badness, key=lambda n: -badness[n]):
        replace_module(quantized, name, copy.deepcopy(original.get_submodule(name)))
        result.weights.pop(name)
        result.kept[name] = f"restored to float: among the most sensitive layers under the budget {budget}"
        record["restored"].append(name)
        drift = output_drift(reference, _outputs(quantized, batches))
        if progress:
            progress(f"INT4 fallback: {len(record['restored'])} layer(s) in float, {budget.metric}={drift.get(budget.metric):.5g}")
        if budget.holds(drift):
            break
    record["after"] = drift
    result.layers = [row for row in result.layers if row.name in result.weights]
    return record
