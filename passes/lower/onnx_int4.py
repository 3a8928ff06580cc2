"""Lower ``infopt.int4_linear`` to ONNX Runtime's ``com.microsoft::MatMulNBits`` (4-bit weights).

``int4_linear(x, qweight, scales, zeros, g_idx, bias, g) -> MatMulNBits([Gather](x), B, scales, zero_points, bias)``

It takes two steps, because while the dynamo exporter translates a node its inputs are symbolic
(``const_value`` is not set), so a translation cannot re-lay out the weights; and weights
re-laid out by ONNX ops (Reshape, BitShift) on the initializers would only be folded by the
exporter's optimizer below its input limit of 8192 elements, so a real layer would ship those
ops.

1. :func:`translation_table` maps the op to a placeholder node ``infopt::Int4Linear`` that
   keeps the stored tensors as its inputs (its OpSchema is built in Python and not registered).
2. :func:`lower_int4_nodes` rewrites each placeholder on the exported ``onnx_ir`` model, where
   the initializers' values are known, into ``MatMulNBits`` with new initializers.

The initializers follow ONNX Runtime's contrib op documentation
(``docs/ContribOperators.md#com.microsoft.MatMulNBits``) and the shape checks of its CPU kernel
(``contrib_ops/cpu/quantization/matmul_nbits_helper.h``), for ``N`` outputs, ``K`` inputs, group
``g`` and ``G = K // g`` groups:

- ``B``: uint8 ``[N, G, g // 2]``, the bytes of ``qweight`` unchanged (its rows are the blocks;
  with act-order, the codes' columns permuted as below);
- ``scales``: ``[N, G]`` in the input's float type;
- ``zero_points``: uint8 ``[N, ceil(G / 2)]``, two 4-bit zero points per byte along ``G``, low
  nibble first, each row padded on its own; left out when every zero point is 8, the op's default;
- ``bias``: ``[N]`` in the input's float type, through the op's bias input.

ONNX Runtime's CPU kernel accepts ``g`` of 16, 32, 64, 128 or 256. Its ``g_idx`` input is
deprecated, turns off the prepacked INT4 kernels (the weight is dequantized on every run), and
in ONNX Runtime 1.31 with packed zero points did not reproduce the dequantized weight; so GPTQ
act-order is lowered by sorting the input features by group instead: ``Gather(x, perm, axis=-1)``
and ``B`` built from the codes with columns ``perm``, which holds when every group has exactly ``g`` members (as GPTQ's
act-order assigns them). AWQ's ``input_scale`` is a ``Div`` before the node in the exported graph
and is left as it is.
"""

from __future__ import annotations

import infopt.quantize.int4_format  # noqa: F401  (registers infopt::int4_linear)
from infopt.core.errors import BuildError
from infopt.core.memory import drop_file_pages, file_mappings
from infopt.quantize.int4_format import pack_int4, unpack_int4
from infopt.quantize.int8_weights import quantize_8bit
from infopt.quantize.layer_choice import EIGHT_BIT_BLOCK

DOMAIN = "infopt"
PLACEHOLDER = "Int4Linear"
MS_DOMAIN = "com.microsoft"
BLOCK_SIZES = (16, 32, 64, 128, 256)
"""The block sizes ONNX Runtime's CPU MatMulNBits kernel accepts (1.31, ``matmul_nbits.cc``)."""


def block_size_for(k: int, wanted: int) -> int | None:
    """The largest of ``wanted``, 64, 32 and 16 (none above ``wanted``) that ``MatMulNBits`` takes and that divides
    ``k`` input features; None when none does."""
    return next((g for g in (wanted, 64, 32, 16) if g <= wanted and g in BLOCK_SIZES and k % g == 0), None)


def translation_table() -> dict:
    """``custom_translation_table`` entries for ``torch.onnx.export`` (dynamo)."""
    import onnxscript
    import torch
    from onnx.defs import OpSchema

    param, option = OpSchema.FormalParameter, OpSchema.FormalParameterOption
    floats = ["tensor(float)", "tensor(float16)", "tensor(bfloat16)"]
    schema = OpSchema(
        PLACEHOLDER, DOMAIN, 1,
        inputs=[param("x", "T"), param("qweight", "tensor(uint8)"), param("scales", "S"),
                param("zeros", "tensor(uint8)"), param("g_idx", "tensor(int32)", param_option=option.Optional),
                param("bias", "S", param_option=option.Optional)],
        outputs=[param("y", "T")],
        type_constraints=[("T", floats, "activations"), ("S", floats, "stored scales and bias")],
        attributes=[OpSchema.Attribute("group_size", OpSchema.AttrType.INT, "quantization group size")],
    )
    placeholder = onnxscript.values.Op(onnxscript.values.Opset(DOMAIN, 1), PLACEHOLDER, schema)

    def int4_linear(x, qweight, scales, zeros, g_idx=None, bias=None, group_size: int = 128):
        return placeholder(x, qweight, scales, zeros, g_idx, bias, group_size=group_size)

    return {torch.ops.infopt.int4_linear.default: int4_linear}


def stored(value, what: str, where: str):
    """The numpy array behind an initializer input; a computed input cannot be re-laid out."""
    if value is None or value.const_value is None:
        raise BuildError(f"the INT4 layer's {what} is computed in the graph, not a stored weight",
                         where=where, fix="keep the packed INT4 tensors as buffers of the Int4Linear module")
    return value.const_value.numpy()


def act_order_permutation(g_idx, in_features: int, group_size: int, where: str):
    """Input features sorted by group (stable), or a BuildError when groups are not ``g`` wide."""
    import numpy as np

    g_idx = g_idx.astype(np.int64).reshape(-1)
    groups = in_features // group_size
    valid = g_idx.size == in_features and g_idx.min() >= 0
    counts = np.bincount(g_idx, minlength=groups) if valid else None
    if counts is None or counts.size != groups or not np.all(counts == group_size):
        raise BuildError("the INT4 layer's g_idx does not give every group exactly "
                         f"{group_size} input features, so MatMulNBits cannot hold it",
                         where=where, fix="quantize with act-order groups of equal size (GPTQ's) or without act-order")
    return np.argsort(g_idx, kind="stable")


def pack_zero_points(zeros):
    """uint8 ``[N, G]`` (0..15) -> uint8 ``[N, ceil(G / 2)]``, low nibble first, per row."""
    import numpy as np
    import torch

    if zeros.shape[1] % 2:
        zeros = np.concatenate([zeros, np.zeros((zeros.shape[0], 1), np.uint8)], axis=1)
    return pack_int4(torch.from_numpy(np.ascontiguousarray(zeros))).numpy()


def permute_packed(qweight, perm):
    """uint8 ``[N, K // 2]`` with codes in column order ``perm``, repacked low nibble first."""
    import torch

    return pack_int4(unpack_int4(torch.from_numpy(qweight.copy()))[:, torch.from_numpy(perm)]).numpy()


def module_path(node) -> str:
    """The module an ``infopt::Int4Linear`` placeholder lowers, from its ``qweight``'s name
    (``lm.model.layers.3.mlp.down_proj.qweight`` -> ``lm.model.layers.3.mlp.down_proj``)."""
    return (node.inputs[1].name or "").removesuffix("qweight").rstrip(".")


def lower_node(graph, node, accuracy_level: int, eight_bit=None) -> list:
    """Replace one placeholder in ``graph`` by ``[Gather ->] MatMulNBits``; returns the stored inputs it replaced.
    Where ``eight_bit`` (``layer_choice.EightBitLayers``) holds the layer's float weight, the op holds that weight
    in 8 bits instead (``quantize/int8_weights.py``, block 32, accuracy level 4)."""
    import numpy as np

    where = f"ONNX node {node.name or PLACEHOLDER}"
    x, qweight, scales, zeros, g_idx, bias = (list(node.inputs) + [None] * 6)[:6]
    group_size = node.attributes["group_size"].as_int()
    prefix = module_path(node) or node.name
    path = prefix.removeprefix("lm.")
    if eight_bit is not None and path in eight_bit.floats:
        _lower_8bit(graph, node, x, eight_bit.weight(path), None if bias is None else stored(bias, "bias", where),
                    prefix)
        return [v for v in (qweight, scales, zeros, g_idx, bias) if v is not None]
    packed = stored(qweight, "qweight", where)
    k = packed.shape[1] * 2
    perm = None
    if g_idx is not None:
        perm = act_order_permutation(stored(g_idx, "g_idx", where), k, group_size, where)
        if np.array_equal(perm, np.arange(k)):
            perm = None
    replace_with_nbits(graph, node, x, packed, stored(scales, "scales", where), stored(zeros, "zeros", where),
                       None if bias is None else stored(bias, "bias", where), group_size, accuracy_level, prefix,
                       perm=perm)
    return [v for v in (qweight, scales, zeros, g_idx, bias) if v is not None]


EIGHT_BIT_LEVEL = 4
"""the accuracy level of 8-bit MatMulNBits: ONNX Runtime's CPU kernels for 8-bit weights exist at it alone"""


def _lower_8bit(graph, node, x, float_weight, bias, prefix: str) -> None:
    """``node`` as an 8-bit ``MatMulNBits`` over ``float_weight`` (``(weight [out, in], bias)``, the layer's own)."""
    import torch

    weight, _ = float_weight
    block = block_size_for(weight.shape[1], EIGHT_BIT_BLOCK)
    codes, scales, zeros = quantize_8bit(weight.to(torch.float32), block)
    drop_file_pages(weight, file_mappings())  # read once: a mapped checkpoint's pages go back, as after INT4
    replace_with_nbits(graph, node, x, codes.numpy(), scales.numpy(), zeros.numpy(), bias, block, EIGHT_BIT_LEVEL,
                       prefix, bits=8)


def replace_with_nbits(graph, node, x, packed, scales, zeros, bias, group_size: int, accuracy_level: int,
                       prefix: str, *, perm=None, bits: int = 4):
    """Replace ``node`` (whose first output is ``x @ W.T (+ bias)``) by ``[Gather ->] MatMulNBits`` holding
    ``W`` in infopt's packed layout: ``packed`` uint8 ``[N, K // 2]``, ``scales`` ``[N, G]``, ``zeros``
    uint8 ``[N, G]``, ``bias`` ``[N]`` or None; ``perm`` sorts the input features by group (act-order).
    With ``bits=8`` (``quantize/int8_weights.py``), ``packed`` is the codes ``[N, K]``, one a byte, and the zero
    points are stored one a byte (128 is the op's default). Returns the ``MatMulNBits`` node."""
    import numpy as np
    import onnx_ir as ir

    where = f"ONNX node {node.name or node.op_type}"
    per_byte = 8 // bits
    n, k = packed.shape[0], packed.shape[1] * per_byte
    default_zero = 1 << (bits - 1)
    if group_size not in BLOCK_SIZES or k % group_size:
        raise BuildError(f"ONNX Runtime's MatMulNBits needs a group size of {', '.join(map(str, BLOCK_SIZES))} "
                         f"that divides K={k}; this layer has {group_size}",
                         where=where, fix="quantize the layer again with group size 32, 64 or 128")
    known = x.dtype or node.outputs[0].dtype  # a value's type may be unset after graph rewrites: the weights' then
    float_type = known.numpy() if known is not None else scales.dtype
    new = []

    def initializer(suffix: str, array):
        tensor = ir.tensor(np.ascontiguousarray(array))
        name, copy = f"{prefix}.nbits_{suffix}", 0
        while name in graph.initializers:
            copy += 1
            name = f"{prefix}.nbits_{suffix}_{copy}"
        value = ir.Value(name=name, type=ir.TensorType(tensor.dtype), shape=tensor.shape,
                         const_value=tensor)
        graph.register_initializer(value)
        return value

    a = x
    if perm is not None:
        packed = permute_packed(packed, perm) if bits == 4 else packed[:, perm]
        new.append(ir.node("Gather", [x, initializer("perm", perm.astype(np.int64))], {"axis": -1}))
        a = new[-1].outputs[0]
    points = pack_zero_points(zeros) if bits == 4 else np.ascontiguousarray(zeros, dtype=np.uint8)
    inputs = [a, initializer("B", packed.reshape(n, k // group_size, group_size // per_byte)),
              initializer("scales", scales.astype(float_type)),
              None if np.all(zeros == default_zero) else initializer("zero_points", points),
              None,
              None if bias is None else initializer("bias", bias.astype(float_type))]
    while inputs[-1] is None:
        inputs.pop()
    attributes = {"K": k, "N": n, "bits": bits, "block_size": group_size, "accuracy_level": accuracy_level}
    new.append(ir.node("MatMulNBits", inputs, attributes, domain=MS_DOMAIN, name=node.name))
    result = new[-1].outputs[0]
    if node.outputs[0].dtype is not None:  # a value left untyped by a graph rewrite stays untyped
        result.dtype, result.shape = node.outputs[0].dtype, node.outputs[0].shape
    ir.convenience.replace_nodes_and_values(graph, node, [node], new, node.outputs, [result])
    return new[-1]


def lower_int4_nodes(model, accuracy_level: int = 0, eight_bit=None) -> tuple[int, int]:
    """Rewrite every ``infopt::Int4Linear`` in ``model`` (onnx_ir) in place, those ``eight_bit`` names to 8 bits
    (:func:`lower_node`); returns how many, and how many of them to 8 bits."""
    import onnx_ir as ir

    count, eights, replaced = 0, 0, []
    for node in list(ir.traversal.RecursiveGraphIterator(model.graph)):
        if node.domain == DOMAIN and node.op_type == PLACEHOLDER:
            eights += eight_bit is not None and module_path(node).removeprefix("lm.") in eight_bit.floats
            replaced += lower_node(node.graph, node, accuracy_level, eight_bit)
            count += 1
    if not count:
        return 0, 0
    for value in replaced:
        if value.is_initializer() and not value.uses() and not value.is_graph_output():
            value.graph.initializers.pop(value.name, None)
    model.opset_imports.pop(DOMAIN, None)
    model.opset_imports[MS_DOMAIN] = 1
    return count, eights
