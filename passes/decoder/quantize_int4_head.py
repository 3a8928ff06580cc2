"""The output head of a KV decoder to INT4 on the graph (``onnx -> onnx``): RTN ``MatMulNBits``.

``quantize_int4`` leaves the head (``lm_head``) in float, since its logits pick every token; in a small LM it
is nonetheless the largest layer, read for every token, so this pass rounds it afterwards (RTN, asymmetric),
as ONNX Runtime GenAI's builder does too. A head tied to the embedding (``MatMul(x, Transpose(embedding))``, or
``FusedMatMul(x, embedding, transB=1)`` as ``fuse_decoder`` writes it) is rounded from the embedding's table, and
by default (``tied_embedding: shared``) the embedding's lookup then reads the same INT4 table:
``GatherBlockQuantized`` on the head's ``MatMulNBits`` weight, so the model stores the table once, in INT4, where
it held it in fp32 beside an INT4 copy (Qwen2.5-0.5B's 151936 x 896 table is 545 MB in fp32, 68 MB in INT4).
``tied_embedding: float`` keeps the lookup's fp32 table. The group size is the largest the other INT4 layers got
(their ``MatMulNBits`` ``block_size``), else the option's.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from infopt.core.artifact import Artifact
from infopt.core.onnx_graph import SCOPES, save_ir
from infopt.core.pass_api import Pass, PassContext, PassDetails, PassOptions, PassOutcome
from infopt.passes.lower.onnx_int4 import block_size_for, replace_with_nbits
from infopt.quantize.int4_format import HEAD_NAMES
from infopt.quantize.rtn import rtn_quantize


class QuantizeInt4HeadOptions(PassOptions):
    group_size: int = Field(128, description="the group size when no other layer is INT4 (else theirs)")
    accuracy_level: int = Field(4, ge=0, le=4, description="MatMulNBits accuracy_level: 4 quantizes the activations "
                                                           "to int8 per block inside the op (fastest on CPU)")
    tied_embedding: Literal["shared", "float"] = Field(
        "shared", description="a head tied to the embedding: shared, the lookup reads the head's INT4 table "
                              "(GatherBlockQuantized); float, the lookup keeps its fp32 table")


class QuantizeInt4HeadDetails(PassDetails):
    head: str | None = None
    """the head's module path; None when it is not a MatMul with a stored weight"""
    shape: list[int] = Field(default_factory=list)
    group_size: int | None = None
    embedding: str | None = None
    """how the tied embedding's lookup reads its table (None: the head is not tied)"""


def run(artifact: Artifact, options: QuantizeInt4HeadOptions, context: PassContext) -> PassOutcome:
    import numpy as np
    import onnx_ir as ir
    import torch

    model = ir.load(str(artifact.path))
    blocks = [node.attributes["block_size"].as_int() for node in model.graph
              if node.op_type == "MatMulNBits" and "block_size" in node.attributes]
    group_size = max(blocks) if blocks else options.group_size
    for node in list(model.graph):
        scopes = node.metadata_props.get(SCOPES, "")
        named = [s.strip(" '\"") for s in scopes.strip("[]").split(",")][:-1]
        weight = node.inputs[1] if node.op_type in ("MatMul", "FusedMatMul") and len(node.inputs) == 2 else None
        if not named or named[-1].split(".")[-1] not in HEAD_NAMES or weight is None:
            continue
        transpose = weight.producer()  # a head tied to the embedding: MatMul(x, Transpose(embedding))
        if node.op_type == "FusedMatMul":  # or the embedding's table read as stored (fuse_decoder)
            if not reads_transposed(node) or weight.const_value is None:
                continue
            rows, table, transpose = weight.const_value.numpy(), weight, None
        elif weight.const_value is not None:
            rows, table = weight.const_value.numpy().T, None  # MatMul's [K, N] as the Linear's [N, K]
        elif transpose is not None and transpose.op_type == "Transpose" and transpose.inputs[0].const_value is not None:
            rows, table = transpose.inputs[0].const_value.numpy(), transpose.inputs[0]
        else:
            continue
        rows = torch.from_numpy(np.ascontiguousarray(rows)).float()
        size = block_size_for(rows.shape[1], group_size)
        if size is None:
            return PassOutcome(artifact, False, [f"the output head stays in float: no group size divides its "
                                                 f"{rows.shape[1]} inputs"],
                               QuantizeInt4HeadDetails(head=named[-1], shape=list(rows.shape)))
        context.say(f"the output head ({named[-1]}) to INT4")
        packed = rtn_quantize(rows, size, symmetric=False, read_only_file=True)  # the table as the file holds it
        nbits = replace_with_nbits(model.graph, node, node.inputs[0], packed.qweight.numpy(), packed.scales.numpy(),
                                   packed.zeros.numpy(), None, size, options.accuracy_level, named[-1])
        notes = [f"the output head ({named[-1]}, {rows.shape[0]} x {rows.shape[1]}) to INT4 by RTN, group size {size}: "
                 "the largest layer of a small LM, read for every token"]
        embedding = None
        if transpose is not None and not weight.uses():  # the tied head's Transpose, read by nothing now
            model.graph.remove(transpose, safe=True)
        if table is not None and table.uses():  # tied: the lookup reads the table too
            embedding = "float"
            if options.tied_embedding == "shared":
                shared = share_table(model.graph, table, nbits, size, zeros=packed.zeros.numpy())
                if shared:
                    embedding = "shared"
                    notes.append(f"the tied embedding's lookup reads the head's INT4 table ({shared} "
                                 "GatherBlockQuantized): one table, stored once")
            if not table.uses():
                model.graph.initializers.pop(table.name, None)
        elif not (table or weight).uses():
            model.graph.initializers.pop((table or weight).name, None)
        (context.workdir / "head-int4").mkdir(parents=True, exist_ok=True)
        dst = save_ir(model, context.workdir / "head-int4" / "model.onnx")
        return PassOutcome(artifact.derive("onnx", path=dst), True, notes,
                           QuantizeInt4HeadDetails(head=named[-1], shape=list(rows.shape), group_size=size,
                                                   embedding=embedding))
    return PassOutcome(artifact, False, ["the output head is not a MatMul with a stored weight: left as it is"],
                       QuantizeInt4HeadDetails())


def reads_transposed(node) -> bool:
    """A ``FusedMatMul`` that is a plain MatMul of ``x`` by its weight's transpose (``transB=1``, nothing else)."""
    attributes = {name: attr.value for name, attr in node.attributes.items()}
    return (node.domain == "com.microsoft" and attributes.get("transB") == 1 and not attributes.get("transA")
            and attributes.get("alpha", 1.0) == 1.0 and not attributes.get("transBatchA")
            and not attributes.get("transBatchB"))


def share_table(graph, table, nbits, group_size: int, bits: int = 4, zeros=None) -> int:
    """Each ``Gather(table, ids)`` (the embedding's lookup) made to read the ``MatMulNBits`` node's weight
    (:func:`block_quantized_lookups`): the tied head's table, stored once; returns how many. The lookup reads the
    node's own scales too, and at 8 bits its zero points, reshaped in the graph, so they are stored once as well
    (ONNX Runtime folds the reshape when the session starts). ``zeros``: at 4 bits, the zero points unpacked
    ``[N, G]`` (the node packs two to a byte, the lookup takes one a byte)."""
    if len(nbits.inputs) < 4 or nbits.inputs[3] is None:
        zeros = None
    elif bits == 8:
        zeros = nbits.inputs[3]
    return block_quantized_lookups(graph, table, nbits.inputs[1], nbits.inputs[2], zeros, group_size, bits)


def block_quantized_lookups(graph, table, weight, scales, zeros, group_size: int, bits: int) -> int:
    """Each ``Gather(table, ids)`` replaced by ``GatherBlockQuantized`` on ``weight`` ``[N, G, group_size * bits / 8]``
    (``MatMulNBits``' layout: its last axis one block, the same bytes read by row), with ``scales`` ``[N, G]`` (in the
    table's float type) and ``zeros`` ``[N, G]`` (None: the op's default) as ``[N, G, 1]``, and a ``Reshape`` to
    ``[..., K]``; returns how many. ``scales`` and ``zeros`` are arrays, or values already in the graph (a
    ``MatMulNBits`` node's), which a ``Reshape`` then reads."""
    import numpy as np
    import onnx_ir as ir

    lookups = [node for node, index in table.uses() if node.op_type == "Gather" and index == 0
               and node.attributes.get("axis", ir.AttrInt64("axis", 0)).as_int() == 0]
    if not lookups:
        return 0
    n, blocks, k = weight.shape[0], weight.shape[1], weight.shape[1] * group_size

    def constant(name: str, array) -> ir.Value:
        tensor = ir.tensor(np.ascontiguousarray(array))
        value = ir.Value(name=name, type=ir.TensorType(tensor.dtype), shape=tensor.shape, const_value=tensor)
        graph.register_initializer(value)
        return value

    def per_block(name: str, values, dtype=None) -> ir.Value:
        if not isinstance(values, ir.Value):
            array = values if dtype is None else values.astype(dtype)
            return constant(f"{table.name}.gbq_{name}", array.reshape(n, blocks, 1))
        reshape = ir.node("Reshape", [values, constant(f"{table.name}.gbq_{name}_shape",
                                                       np.array([n, blocks, 1], np.int64))],
                          name=f"{table.name}.gbq_{name}")
        graph.insert_before(graph[0], [reshape])
        reshape.outputs[0].dtype, reshape.outputs[0].shape = values.dtype, ir.Shape([n, blocks, 1])
        return reshape.outputs[0]

    scale = per_block("scales", scales)
    zero = None if zeros is None else per_block("zero_points", zeros, np.uint8)
    for number, lookup in enumerate(lookups):
        out = lookup.outputs[0]
        rank = len(out.shape) if out.shape is not None else 3
        gather = ir.node("GatherBlockQuantized", [weight, lookup.inputs[1], scale, *([zero] if zero else [])],
                         {"gather_axis": 0, "quantize_axis": 2, "block_size": group_size, "bits": bits},
                         domain="com.microsoft", name=f"{lookup.name}_block_quantized")
        shape = constant(f"{table.name}.gbq_shape_{number}", np.array([0] * (rank - 1) + [k], np.int64))
        reshape = ir.node("Reshape", [gather.outputs[0], shape], name=f"{lookup.name}_rows")
        result = reshape.outputs[0]
        if out.dtype is not None:  # a value left untyped by the export stays untyped
            result.dtype, result.shape = out.dtype, out.shape
        ir.convenience.replace_nodes_and_values(graph, lookup, [lookup], [gather, reshape], lookup.outputs, [result])
    return len(lookups)


PASS = Pass(
    name="quantize_int4_head",
    consumes="onnx",
    produces="onnx",
    run=run,
    options=QuantizeInt4HeadOptions,
    details=QuantizeInt4HeadDetails,
    description="a decoder's output head (lm_head, or the tied embedding) to INT4 MatMulNBits by RTN, on the graph",
)
