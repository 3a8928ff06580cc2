"""A quantized decoder's block scales stored in float16 (``onnx -> onnx``), as llama.cpp's blocks store theirs.

A float32 scale per block of 32 weights costs a whole bit a weight; in float16, 8-bit codes take llama.cpp Q8_0's 8.5
bits. ``MatMulNBits`` and ``GatherBlockQuantized`` take float16 scales, but then compute in float16 too: each op so
rewritten reads its input through a ``Cast`` to float16 (one per input, shared by the ops that read it) and its
output goes back to float32 through another. At accuracy level 4 the op rounds its input to int8 per block anyway,
so the float16 input costs nothing more; its output is rounded to float16 (11 bits), and a bias is added after, in
float32. The 8-bit grid's scales are float16 values already (``quantize/int8_weights.py``); a 4-bit one moves by at
most half a float16 step (2^-12 of it), far below its codes' step. An input beyond float16's range (65,504) becomes
infinite: the verdict then fails on figures that are not finite and names ``--float32-scales``, which skips this pass.
"""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field

from infopt.core.artifact import Artifact
from infopt.core.onnx_graph import save_ir
from infopt.core.pass_api import Pass, PassContext, PassDetails, PassOptions, PassOutcome

OPS = ("MatMulNBits", "GatherBlockQuantized")


class HalfScalesOptions(PassOptions):
    SETTINGS: ClassVar[dict[str, str]] = {"float32": "float32_scales"}

    float32: bool = Field(False, description="keep the scales in float32: leave the graph as it is")


class HalfScalesDetails(PassDetails):
    nodes: int = 0
    """MatMulNBits and GatherBlockQuantized nodes that now read float16 scales"""
    saved_bytes: int = 0
    """bytes the scales no longer take"""


def run(artifact: Artifact, options: HalfScalesOptions, context: PassContext) -> PassOutcome:
    import onnx_ir as ir

    details = HalfScalesDetails()
    if options.float32:
        return PassOutcome(artifact, False, ["scales kept in float32 (--float32-scales)"], details)
    model = ir.load(str(artifact.path))
    graph = model.graph
    halved: dict[str, ir.Value] = {}
    casts: dict[int, ir.Value] = {}
    for node in list(graph):
        if node.domain != "com.microsoft" or node.op_type not in OPS or len(node.inputs) < 3:
            continue
        scales = _half_scales(graph, node.inputs[2], halved, details)
        if scales is None:
            continue
        inputs, bias = list(node.inputs), None
        inputs[2] = scales
        if node.op_type == "MatMulNBits":
            inputs[0] = _as_half(graph, node, inputs[0], casts)
            if len(inputs) > 5:
                bias, inputs = inputs[5], inputs[:5]
            while inputs[-1] is None:
                inputs.pop()
        _rewrite(graph, node, inputs, bias)
        details.nodes += 1
    if not details.nodes:
        return PassOutcome(artifact, False, ["no float32 block scales: the graph is left as it is"], details)
    for name in halved:
        if not graph.initializers[name].uses():
            graph.initializers.pop(name)
    (context.workdir / "half-scales").mkdir(parents=True, exist_ok=True)
    dst = save_ir(model, context.workdir / "half-scales" / "model.onnx")
    note = (f"the block scales of {details.nodes} quantized ops in float16 ({details.saved_bytes / 2**20:.1f} MiB "
            "less), as llama.cpp stores its blocks' scales; --float32-scales keeps them in float32")
    return PassOutcome(artifact.derive("onnx", path=dst), True, [note], details)


def _half_scales(graph, value, halved, details):
    """``value`` (float32 scales: an initializer, or a ``Reshape`` of one) as float16; None where it is neither."""
    import numpy as np
    import onnx_ir as ir

    source, reshape = value, None
    if value.producer() is not None:
        reshape = value.producer()
        if reshape.op_type != "Reshape" or reshape.domain not in ("", "ai.onnx"):
            return None
        source = reshape.inputs[0]
    if source is None or not source.is_initializer() or source.const_value is None:
        return None
    if source.dtype != ir.DataType.FLOAT:
        return None
    if source.name not in halved:
        array = source.const_value.numpy()
        tensor = ir.tensor(array.astype(np.float16))
        half = ir.Value(name=f"{source.name}.fp16", type=ir.TensorType(ir.DataType.FLOAT16), shape=source.shape,
                        const_value=tensor)
        graph.register_initializer(half)
        halved[source.name] = half
        details.saved_bytes += array.size * 2
    half = halved[source.name]
    if reshape is None:
        return half
    if reshape.inputs[0] is not half:  # the Reshape's other readers, if any, read float16 from now on as well
        reshape.replace_input_with(0, half)
        reshape.outputs[0].dtype = ir.DataType.FLOAT16
    return reshape.outputs[0]


def _as_half(graph, node, value, casts):
    """``value`` cast to float16 once, however many ops read it."""
    import onnx_ir as ir

    if id(value) not in casts:
        cast = ir.node("Cast", [value], {"to": ir.DataType.FLOAT16}, name=f"{node.name}_input_fp16")
        graph.insert_before(node, [cast])
        cast.outputs[0].dtype, cast.outputs[0].shape = ir.DataType.FLOAT16, value.shape
        casts[id(value)] = cast.outputs[0]
    return casts[id(value)]


def _rewrite(graph, node, inputs, bias) -> None:
    """``node`` again on ``inputs``, its output in float16 and back to float32 through a ``Cast`` (then ``+ bias``)."""
    import onnx_ir as ir

    out = node.outputs[0]
    attributes = {name: attr.value for name, attr in node.attributes.items()}
    new = [ir.node(node.op_type, inputs, attributes, domain=node.domain, name=node.name)]
    new[0].outputs[0].dtype, new[0].outputs[0].shape = ir.DataType.FLOAT16, out.shape
    new.append(ir.node("Cast", [new[0].outputs[0]], {"to": ir.DataType.FLOAT}, name=f"{node.name}_output_fp32"))
    if bias is not None:
        new.append(ir.node("Add", [new[-1].outputs[0], bias], name=f"{node.name}_bias"))
    result = new[-1].outputs[0]
    result.dtype, result.shape = ir.DataType.FLOAT, out.shape
    ir.convenience.replace_nodes_and_values(graph, node, [node], new, [out], [result])


PASS = Pass(
    name="half_scales",
    consumes="onnx",
    produces="onnx",
    run=run,
    options=HalfScalesOptions,
    details=HalfScalesDetails,
    description="the block scales of MatMulNBits and GatherBlockQuantized stored in float16",
)
