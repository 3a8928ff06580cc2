"""INT8 for ONNX models: which nodes quantize, and the static (QDQ) and dynamic quantizers.

The layers are the compute nodes with a constant weight: ``Conv``, ``MatMul`` and ``Gemm``.
Static INT8 writes QuantizeLinear/DequantizeLinear pairs around them from a calibration table,
with per-channel symmetric INT8 weights and per-tensor activations. Two placements:

- ``onnxruntime`` (CPU): activations asymmetric uint8, weights int8, the pairing ONNX Runtime's
  x86 kernels fuse into integer convolutions and matmuls.
- ``tensorrt`` (GPU targets): activations and weights symmetric int8 (zero point 0), QDQ on the
  weights kept explicit and one QDQ pair per consumer, the explicit-quantization form TensorRT
  builds engines from.

Dynamic INT8 quantizes MatMul weights per channel ahead of time and activations per batch at
run time; it needs no calibration data and runs on ONNX Runtime's CPU provider.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from infopt.core.onnx_graph import module_path, save_model

log = logging.getLogger("infopt.quantize")

PLACEMENTS = ("onnxruntime", "tensorrt")
STATIC_OPS = ("Conv", "MatMul", "Gemm")
DYNAMIC_OPS = ("MatMul",)


@dataclass(frozen=True)
class Layer:
    """One quantizable node: its name, op, activation input, weight initializer, module and output."""

    node: str
    op: str
    activation: str
    weight: str
    channel_axis: int
    module: str
    output: str


def calibration_tensors(layers_: list[Layer]) -> list[str]:
    """The tensors static INT8 needs ranges for: each layer's activation input and its output."""
    return sorted({name for layer in layers_ for name in (layer.activation, layer.output) if name})


def layers(model, ops: tuple[str, ...] = STATIC_OPS) -> list[Layer]:
    """The nodes of ``model`` (an ``onnx.ModelProto``) that INT8 can quantize, in graph order."""
    inits = {i.name: i for i in model.graph.initializer}
    found = []
    for node in model.graph.node:
        if node.op_type not in ops or len(node.input) < 2 or node.input[1] not in inits:
            continue
        weight = inits[node.input[1]]
        if weight.data_type != 1 or len(weight.dims) < 2:
            continue
        if node.op_type == "MatMul" and len(weight.dims) != 2:
            continue
        axis = 0 if node.op_type == "Conv" else 1
        if node.op_type == "Gemm" and any(a.name == "transB" and a.i for a in node.attribute):
            axis = 0
        found.append(Layer(node.name, node.op_type, node.input[0], node.input[1], axis, module_path(node), node.output[0]))
    return found


@contextlib.contextmanager
def _quiet_quantizer():
    """ONNX Runtime's quantizers warn through the root logger ("Please consider to run pre-processing
    before quantization"): infopt has already inferred shapes, so the advice does not apply here."""
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)
    try:
        yield
    finally:
        root.setLevel(level)


def quantize_static(src: Path, dst: Path, ranges: dict[str, tuple[float, float]], nodes: list[str], *,
                    placement: str = "onnxruntime", activation: str = "uint8", per_channel: bool = True) -> Path:
    """A QDQ model of ``src`` with ``nodes`` quantized using calibrated activation ``ranges``;
    ``activation`` (``uint8``/``int8``) and ``per_channel`` apply to ONNX Runtime's placement."""
    from onnxruntime.quantization import QuantType
    from onnxruntime.quantization.calibrate import CalibrationMethod, TensorsData
    from onnxruntime.quantization.qdq_quantizer import QDQQuantizer
    from onnxruntime.quantization.quant_utils import load_model_with_shape_infer

    model = load_model_with_shape_infer(Path(src))
    tensors = TensorsData(CalibrationMethod.MinMax,
                          {k: (np.float32(lo), np.float32(hi)) for k, (lo, hi) in ranges.items()})
    trt = placement == "tensorrt"
    extra = {"ActivationSymmetric": trt, "WeightSymmetric": True, "AddQDQPairToWeight": trt, "DedicatedQDQPair": trt,
             "OpTypesToExcludeOutputQuantization": ["MatMul", "Gemm"]}
    if trt:
        extra["QDQOpTypePerChannelSupportToAxis"] = {"MatMul": 1}
    signed = trt or activation == "int8"
    with _quiet_quantizer():
        quantizer = QDQQuantizer(model, per_channel or trt, False, QuantType.QInt8,
                                 QuantType.QInt8 if signed else QuantType.QUInt8, tensors, list(nodes) or ["(none)"], [],
                                 list(STATIC_OPS), extra)
        quantizer.quantize_model()
    return save_model(quantizer.model.model, dst)


def quantize_dynamic(src: Path, dst: Path, nodes: list[str], *, per_channel: bool = True) -> Path:
    """Dynamic INT8: int8 MatMul weights (per channel or per tensor), activations quantized per batch at run time."""
    from onnx import TensorProto
    from onnxruntime.quantization import QuantType
    from onnxruntime.quantization import quantize_dynamic as ort_dynamic

    with _quiet_quantizer():
        # float where ONNX's shape inference stops at a contrib op (a decoder's GroupQueryAttention) and
        # leaves a tensor's type unknown
        ort_dynamic(str(src), str(dst), op_types_to_quantize=list(DYNAMIC_OPS), per_channel=per_channel,
                    weight_type=QuantType.QInt8, nodes_to_quantize=list(nodes) or ["(none)"],
                    use_external_data_format=False, extra_options={"DefaultTensorType": TensorProto.FLOAT})
    return dst


def quantized_nodes(path: Path) -> dict[str, int]:
    """Counts of the integer ops in a saved model, for notes and tests."""
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    counts: dict[str, int] = {}
    for node in model.graph.node:
        if node.op_type in ("QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear", "MatMulInteger",
                            "ConvInteger", "DynamicQuantizeMatMul", "QLinearConv", "QLinearMatMul"):
            counts[node.op_type] = counts.get(node.op_type, 0) + 1
    return counts
