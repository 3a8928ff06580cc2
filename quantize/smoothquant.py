"""SmoothQuant for ONNX: move activation outliers into the weights before static INT8.

For a group of MatMul/Gemm layers that read the same activation ``X`` (the Q, K and V
projections after one LayerNorm, say), per input channel ``k``::

    s_k = max|X_k| ** alpha / max|W_k| ** (1 - alpha)

``X`` is divided by ``s`` and each weight's row ``k`` multiplied by it, so the product is
unchanged in exact arithmetic while ``X``'s channels become even enough for per-tensor INT8.
The division folds into the LayerNormalization that produces ``X`` (its scale and bias) when
that is the only thing it changes; with ``fold_only=False`` other activations get an explicit
``Mul`` by ``1/s`` instead.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from infopt.quantize.onnx_int8 import Layer


@dataclass
class SmoothResult:
    groups: int
    folded: int
    inserted: int
    layers: int


def smoothable(layers: list[Layer]) -> dict[str, list[Layer]]:
    """MatMul/Gemm layers grouped by the activation they read."""
    groups: dict[str, list[Layer]] = {}
    for layer in layers:
        if layer.op in ("MatMul", "Gemm"):
            groups.setdefault(layer.activation, []).append(layer)
    return groups


def smooth(model, groups: dict[str, list[Layer]], channel_absmax: dict[str, list[float]], *,
           alpha: float = 0.5, fold_only: bool = True, min_outlier_ratio: float = 0.0) -> SmoothResult:
    """Rescale ``model`` (an ``onnx.ModelProto``) in place; returns what was changed.

    A group is smoothed only when its activation's largest channel maximum is at least
    ``min_outlier_ratio`` times the median one: evenly spread activations quantize well as they
    are, and each inserted ``Mul`` costs run time."""
    from onnx import helper, numpy_helper

    inits = {i.name: i for i in model.graph.initializer}
    uses: dict[str, int] = {}
    for node in model.graph.node:
        for name in node.input:
            uses[name] = uses.get(name, 0) + 1
    producers = {out: node for node in model.graph.node for out in node.output}
    result = SmoothResult(0, 0, 0, 0)
    inserted = []
    for activation, group in groups.items():
        if activation not in channel_absmax or any(uses.get(layer.weight, 0) != 1 for layer in group):
            continue
        act = np.asarray(channel_absmax[activation], np.float64)
        if act.max() < min_outlier_ratio * max(float(np.median(act)), 1e-12):
            continue
        weights = [numpy_helper.to_array(inits[layer.weight]).astype(np.float64) for layer in group]
        rows = [w if layer.channel_axis == 1 else w.T for w, layer in zip(weights, group)]
        if any(r.shape[0] != act.shape[0] for r in rows):
            continue
        wmax = np.max([np.abs(r).max(axis=1) for r in rows], axis=0)
        scale = np.where((act > 0) & (wmax > 0), act ** alpha / np.maximum(wmax, 1e-12) ** (1 - alpha), 1.0)
        scale = np.clip(scale, 1e-5, 1e5)
        producer = producers.get(activation)
        foldable = (producer is not None and producer.op_type == "LayerNormalization" and len(producer.input) == 3
                    and all(n in inits and uses.get(n, 0) == 1 for n in producer.input[1:])
                    and uses.get(activation, 0) == len(group))
        if foldable:
            for name in producer.input[1:]:
                value = numpy_helper.to_array(inits[name])
                inits[name].CopyFrom(numpy_helper.from_array((value / scale).astype(value.dtype), name))
            result.folded += 1
        elif fold_only:
            continue
        else:
            name, factor = f"{activation}_smoothed", f"infopt_smoothquant_{result.inserted}_factor"
            model.graph.initializer.append(numpy_helper.from_array((1.0 / scale).astype(np.float32), factor))
            inserted.append((activation, helper.make_node("Mul", [activation, factor], [name],
                                                          name=f"infopt_smoothquant_{result.inserted}")))
            for node in model.graph.node:
                if any(node.name == layer.node for layer in group):
                    node.input[0] = name
            result.inserted += 1
        for w, layer in zip(weights, group):
            shaped = scale[:, None] if layer.channel_axis == 1 else scale[None, :]
            inits[layer.weight].CopyFrom(numpy_helper.from_array((w * shaped).astype(np.float32), layer.weight))
        result.groups += 1
        result.layers += len(group)
    if inserted:
        _place_after_producers(model, inserted)
    return result


def _place_after_producers(model, inserted) -> None:
    nodes = list(model.graph.node)
    for activation, mul in inserted:
        at = next((i + 1 for i, n in enumerate(nodes) if activation in n.output), 0)
        nodes.insert(at, mul)
    del model.graph.node[:]
    model.graph.node.extend(nodes)
