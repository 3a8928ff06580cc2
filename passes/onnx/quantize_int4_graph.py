"""INT4 weight-only RTN on the ONNX graph, for models that arrive without their Python module.

``MatMul(x, W[K, N])`` and ``Gemm(x, W[N, K], b, transB=1)`` with stored weights
``-> MatMulNBits(x, B, scales, zero_points[, bias])``

TorchScript, ``.pt2`` and ONNX sources have no ``nn.Linear`` modules for ``quantize_int4`` to
calibrate layer by layer, so that pass steps aside (and records its options) and this one
quantizes the exported graph instead: every MatMul or plain Gemm whose weight is a stored 2-D
float initializer, round-to-nearest with the same group-size rule (128, else the largest of
64/32 that divides K, else the node stays in float with the reason in the report). The weights
are packed exactly as :mod:`infopt.passes.lower.onnx_int4` lowers ``Int4Linear`` layers. When
``quantize_int4`` already quantized the module, this pass finds nothing to do and says so.
"""

from __future__ import annotations

from pydantic import Field

from infopt.core import onnx_graph
from infopt.core.artifact import Artifact
from infopt.core.errors import UsageError
from infopt.core.pass_api import Pass, PassContext, PassOptions, PassOutcome
from infopt.passes.fx.quantize_int4 import Int4Details
from infopt.passes.lower.onnx_int4 import replace_with_nbits
from infopt.quantize.rtn import rtn_quantize
from infopt.quantize.weight_only import group_size_for, group_sizes_tried

MODULE_PASS = "quantize_int4"


class GraphInt4Options(PassOptions):
    accuracy_level: int = Field(4, ge=0, le=4, description="MatMulNBits accuracy_level (4: int8 activations on CPU)")


def weight_of(node, graph) -> tuple[object, bool] | None:
    """The stored weight of a MatMul/Gemm node as ``[N, K]`` float32, and whether it is a Gemm with its
    bias, or None when the node is not a plain ``x @ W (+ b)`` with a stored 2-D weight."""
    import numpy as np

    inputs = list(node.inputs)
    if node.op_type not in ("MatMul", "Gemm") or len(inputs) < 2 or inputs[1] is None:
        return None
    w = inputs[1].const_value
    if w is None or len(w.shape) != 2 or w.dtype.numpy() != np.float32:
        return None
    array = w.numpy()
    if node.op_type == "MatMul":
        return array.T, False
    attrs = {k: a.value for k, a in node.attributes.items()}
    if attrs.get("transA", 0) or attrs.get("alpha", 1.0) != 1.0 or attrs.get("beta", 1.0) != 1.0:
        return None
    bias = inputs[2] if len(inputs) > 2 else None
    if bias is not None and (bias.const_value is None or len(bias.const_value.shape) != 1):
        return None
    return (array if attrs.get("transB", 0) else array.T), bias is not None


def module_record(artifact: Artifact):
    return next((r for r in artifact.lineage if r.name == MODULE_PASS), None)


def _asked(record) -> tuple[str, int, bool]:
    """The method, group size and symmetry the module pass was asked for: its options when the
    pipeline skipped it (the source is already past torch), its typed details when it stepped aside
    (a TorchScript module has no Python layers)."""
    if record is not None and record.skipped:
        given = record.details.get("options") or {}
        return given.get("method", "auto"), given.get("group_size", 128), given.get("symmetric", False)
    asked = Int4Details.of(record.details) if record is not None else None
    return (asked.method, asked.group_size, asked.symmetric) if asked else ("auto", 128, False)


def run(artifact: Artifact, options: GraphInt4Options, context: PassContext) -> PassOutcome:
    import numpy as np
    import onnx
    import onnx_ir as ir
    import torch

    record = module_record(artifact)
    if record is not None and record.changed:
        return PassOutcome(artifact, False, [f"nothing to do: {MODULE_PASS} quantized the module"], {})
    method, wanted, symmetric = _asked(record)
    if method not in ("auto", "rtn"):
        raise UsageError(f"INT4 {method.upper()} calibrates layer by layer on the model's Python module, which this "
                         "source (TorchScript, .pt2 or ONNX) does not have",
                         fix="pass --int4-method rtn (the ONNX graph route), or build from a state dict with "
                             "--model-class or a Hugging Face folder for GPTQ/AWQ")
    model = ir.load(str(artifact.path))
    layers, kept = [], {}
    for node in list(ir.traversal.RecursiveGraphIterator(model.graph)):
        found = weight_of(node, node.graph)
        if found is None:
            continue
        weight, has_bias = found
        n, k = weight.shape
        label = node.name or f"{node.op_type} {list(node.inputs)[1].name}"
        size = group_size_for(k, wanted)
        if size is None:
            tried = group_sizes_tried(wanted)
            kept[label] = f"{k} input features: no group size of {', '.join(map(str, tried))} divides them"
            continue
        packed = rtn_quantize(torch.from_numpy(np.ascontiguousarray(weight)), size, symmetric)
        bias = list(node.inputs)[2].const_value.numpy() if has_bias else None
        replace_with_nbits(node.graph, node, list(node.inputs)[0], packed.qweight.numpy(), packed.scales.numpy(),
                           packed.zeros.numpy(), bias, size, options.accuracy_level,
                           list(node.inputs)[1].name or label)
        layers.append({"name": label, "shape": [n, k], "group_size": size, "error": None})
    if not layers and not kept:
        raise UsageError("the model has no MatMul or Gemm with a stored weight to quantize to INT4",
                         fix="INT4 weight-only quantization applies to Linear layers (transformers); use --int8 "
                             "for convolutional models")
    details = Int4Details(method="rtn", group_size=wanted, symmetric=symmetric, layers=layers, kept=kept,
                          route="onnx graph")
    notes = [f"{len(layers)} MatMul/Gemm weights to INT4 with RTN on the ONNX graph (the source has no Python "
             "module to calibrate layer by layer)"]
    notes += [f"kept {name} in float: {why}" for name, why in kept.items()]
    if context.calibration is not None:
        notes.append("calibration data unused: GPTQ and AWQ need the model's Python module")
    if not layers:
        notes.append("no layer was quantized: this artifact computes in float")
        return PassOutcome(artifact, False, notes, details)
    onnx_graph.drop_unused_ir_initializers(model.graph)
    model.opset_imports["com.microsoft"] = 1
    path = context.workdir / "int4_graph.onnx"
    onnx_graph.save_ir(model, path)
    onnx.checker.check_model(str(path))
    return PassOutcome(artifact.derive("onnx", path=path), True, notes, details)


PASS = Pass(
    name="quantize_int4_graph",
    consumes="onnx",
    produces="onnx",
    run=run,
    options=GraphInt4Options,
    details=Int4Details,
    description="INT4 RTN of an ONNX graph's MatMul/Gemm weights to MatMulNBits, for sources without a Python module",
    stands_in_for=("quantize_int4",),
)
