"""FP8 (E4M3) Q/DQ for ONNX models, the explicit quantization TensorRT builds FP8 engines from.

Each layer (a ``MatMul``, ``Gemm`` or ``Conv`` with a constant weight, ``onnx_int8.layers``) gets:

- on its activation input, ``QuantizeLinear`` -> ``DequantizeLinear`` with a per-tensor scale, the calibrated
  absolute maximum over 448 (E4M3's largest finite value), and a float8e4m3fn zero point of 0;
- its weight stored as float8e4m3fn, one scale per output channel, behind a ``DequantizeLinear`` along that axis.

That is where NVIDIA's Model Optimizer places them; matmuls between two activations (attention's) keep float.
ONNX Runtime's CPU provider runs these nodes (opset 19 and later) by dequantizing to float: the rounding, and so
the drift, is FP8's, the speed is not a GPU's.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from infopt.core.onnx_graph import save_model
from infopt.quantize.onnx_int8 import Layer

E4M3_MAX = 448.0
"""the largest finite float8e4m3fn value"""
MIN_OPSET = 19
"""the first opset whose QuantizeLinear/DequantizeLinear take float8"""


def to_e4m3_bytes(values: np.ndarray) -> bytes:
    """``values`` rounded to float8e4m3fn (nearest, saturated at +-448), one byte each."""
    import torch

    clipped = torch.from_numpy(np.ascontiguousarray(values, dtype=np.float32)).clamp(-E4M3_MAX, E4M3_MAX)
    return clipped.to(torch.float8_e4m3fn).view(torch.uint8).numpy().tobytes()


def weight_scales(weight: np.ndarray, axis: int) -> np.ndarray:
    """One scale per output channel (``axis``): its absolute maximum over 448 (1 for a channel of zeros)."""
    others = tuple(i for i in range(weight.ndim) if i != axis)
    amax = np.abs(weight).max(axis=others).astype(np.float32)
    return np.where(amax > 0, amax / E4M3_MAX, 1.0).astype(np.float32)


def activation_scale(low: float, high: float) -> float:
    amax = max(abs(float(low)), abs(float(high)))
    return amax / E4M3_MAX if amax > 0 else 1.0


def quantize(src: Path, dst: Path, layers: list[Layer], ranges: dict[str, tuple[float, float]],
             nodes: list[str] | None = None) -> Path:
    """Write ``src`` with FP8 Q/DQ on ``nodes`` (default: every layer) to ``dst``; ``ranges`` holds each
    activation's calibrated (low, high)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    model = onnx.load(str(src))
    _require_opset(model)
    chosen = set(nodes if nodes is not None else [layer.node for layer in layers])
    by_name = {node.name: node for node in model.graph.node}
    inits = {init.name: init for init in model.graph.initializer}
    added_nodes, added_inits, activations = [], [], {}
    for layer in layers:
        if layer.node not in chosen:
            continue
        node = by_name[layer.node]
        if layer.activation not in activations:  # one Q/DQ pair per activation, shared by its layers (Q, K, V)
            stem = _safe(layer.activation)
            low, high = ranges[layer.activation]
            added_inits += [numpy_helper.from_array(np.array(activation_scale(low, high), np.float32), f"{stem}_fp8_scale"),
                            helper.make_tensor(f"{stem}_fp8_zero", TensorProto.FLOAT8E4M3FN, [], b"\x00", raw=True)]
            added_nodes += [helper.make_node("QuantizeLinear", [layer.activation, f"{stem}_fp8_scale", f"{stem}_fp8_zero"],
                                             [f"{stem}_fp8"], name=f"{stem}_QuantizeLinear_fp8"),
                            helper.make_node("DequantizeLinear", [f"{stem}_fp8", f"{stem}_fp8_scale", f"{stem}_fp8_zero"],
                                             [f"{stem}_fp8_dq"], name=f"{stem}_DequantizeLinear_fp8")]
            activations[layer.activation] = f"{stem}_fp8_dq"
        weight = numpy_helper.to_array(inits[layer.weight])
        scales = weight_scales(weight, layer.channel_axis)
        shape = [1] * weight.ndim
        shape[layer.channel_axis] = -1
        stem = _safe(layer.weight)
        added_inits += [helper.make_tensor(f"{stem}_fp8", TensorProto.FLOAT8E4M3FN, list(weight.shape),
                                           to_e4m3_bytes(weight / scales.reshape(shape)), raw=True),
                        numpy_helper.from_array(scales, f"{stem}_fp8_scale"),
                        helper.make_tensor(f"{stem}_fp8_zero", TensorProto.FLOAT8E4M3FN, [len(scales)],
                                           bytes(len(scales)), raw=True)]
        added_nodes.append(helper.make_node("DequantizeLinear", [f"{stem}_fp8", f"{stem}_fp8_scale", f"{stem}_fp8_zero"],
                                            [f"{stem}_fp8_dq"], name=f"{stem}_DequantizeLinear_fp8",
                                            axis=layer.channel_axis))
        node.input[0], node.input[1] = activations[layer.activation], f"{stem}_fp8_dq"
    used = {name for node in model.graph.node for name in node.input}
    kept = [init for init in model.graph.initializer if init.name in used]
    del model.graph.initializer[:]
    model.graph.initializer.extend(kept + added_inits)
    _insert_before_users(model, added_nodes)
    return save_model(model, dst)


def fp8_nodes(path: Path) -> dict[str, int]:
    """How many Q/DQ nodes of ``path`` carry float8e4m3fn, by op, read from the graph (zero points' types)."""
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    fp8 = {init.name for init in model.graph.initializer if init.data_type == onnx.TensorProto.FLOAT8E4M3FN}
    counts: dict[str, int] = {}
    for node in model.graph.node:
        if node.op_type in ("QuantizeLinear", "DequantizeLinear") and len(node.input) > 2 and node.input[2] in fp8:
            counts[node.op_type] = counts.get(node.op_type, 0) + 1
    return counts


def _require_opset(model) -> None:
    """Raise the default domain's opset to 19 where it is lower: from 18 the ops that changed only gained types
    (float8) and Pad/Shape attributes with the old defaults; older models go through ONNX's version converter."""
    import onnx

    current = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), None)
    if current is None or current >= MIN_OPSET:
        return
    if current == 18:
        for entry in model.opset_import:
            if entry.domain in ("", "ai.onnx"):
                entry.version = MIN_OPSET
        return
    converted = onnx.version_converter.convert_version(model, MIN_OPSET)
    model.CopyFrom(converted)


def _insert_before_users(model, added) -> None:
    """Put ``added`` into the graph ahead of the first node that reads any of their outputs (the graph stays in
    topological order, which ONNX requires)."""
    produced = {out: node for node in added for out in node.output}
    ordered, placed = [], set()

    def place(node) -> None:
        if id(node) in placed:
            return
        for name in node.input:
            if name in produced:
                place(produced[name])
        placed.add(id(node))
        ordered.append(node)

    for node in list(model.graph.node):
        for name in node.input:
            if name in produced:
                place(produced[name])
        ordered.append(node)
    del model.graph.node[:]
    model.graph.node.extend(ordered)


def _safe(name: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "_." else "_" for ch in name)
