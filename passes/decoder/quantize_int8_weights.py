"""A KV decoder's weights to INT8 on the graph (``onnx -> onnx``): weight-only ``MatMulNBits`` with ``bits=8``.

Every ``MatMul`` (and plain ``Gemm``) with a stored float weight becomes ``MatMulNBits`` holding the weight's
8-bit codes per block of input features (``quantize/int8_weights.py``); the activations stay in float, so an
LLM's activation outliers cost nothing. The output head is rounded too (``keep_head: false``): tied to the
embedding, its table is rounded once and the embedding's lookup reads the same bytes (``GatherBlockQuantized``,
``bits=8``), so the table is stored once in INT8 where it was stored in float.

The block is the largest of ``block_size``, 64, 32 and 16 that divides the layer's input features.
``accuracy_level`` 4 (the default) has the op quantize each block of ``block_size`` activations to int8 with
its own scale, so an outlier coarsens its own block only; ONNX Runtime's CPU kernels for 8-bit weights exist at
that level alone (at 0 the weight is dequantized on every call). The figures that chose the defaults are in
``benchmarks/results/real_llm.md``.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from infopt.core.artifact import Artifact
from infopt.core.onnx_graph import SCOPES, drop_unused_ir_initializers, save_ir, scoped_module
from infopt.core.pass_api import Pass, PassContext, PassDetails, PassOptions, PassOutcome
from infopt.passes.decoder.quantize_int4_head import reads_transposed, share_table
from infopt.passes.lower.onnx_int4 import block_size_for, replace_with_nbits
from infopt.passes.onnx.quantize_int4_graph import weight_of
from infopt.quantize.int4_format import HEAD_NAMES
from infopt.quantize.int8_weights import quantize_8bit
from infopt.quantize.layer_choice import SCALE_BITS


class QuantizeInt8WeightsOptions(PassOptions):
    block_size: int = Field(32, description="input features per scale and zero point (the largest of this, 64, 32 "
                                            "and 16 that divides a layer's inputs)")
    symmetric: bool = Field(True, description="symmetric grid (zero point 128, none stored) instead of each block's "
                                              "min/max")
    search: bool = Field(True, description="the symmetric grid's scale searched for the least squared error, not "
                                           "max|w| / 127")
    accuracy_level: int = Field(4, ge=0, le=4, description="MatMulNBits accuracy_level: 4 quantizes each block of "
                                                           "the activations to int8 inside the op (ONNX Runtime's "
                                                           "8-bit CPU kernels); 0 dequantizes the weight every call, "
                                                           "30-40x slower")
    keep_head: bool = Field(False, description="leave the output head (and a tied embedding) in float")
    tied_embedding: Literal["shared", "float"] = Field(
        "shared", description="a head tied to the embedding: shared, the lookup reads the head's INT8 table "
                              "(GatherBlockQuantized); float, the lookup keeps its float table")


class QuantizeInt8WeightsDetails(PassDetails):
    layers: int = 0
    """MatMuls now MatMulNBits with 8-bit weights"""
    block_sizes: list[int] = Field(default_factory=list)
    head: str | None = None
    """the head's module path, when it was rounded"""
    embedding: str | None = None
    """how a tied embedding's lookup reads its table: shared (the head's INT8 table), float, or None (not tied)"""
    kept: dict[str, str] = Field(default_factory=dict)
    """MatMuls left in float, with the reason"""
    bits_per_weight: float | None = None
    """the rounded weights' bytes (codes, float16 scales as ``half_scales`` stores them, zero points) over their
    count, in bits"""


def run(artifact: Artifact, options: QuantizeInt8WeightsOptions, context: PassContext) -> PassOutcome:
    import numpy as np
    import onnx_ir as ir
    import torch

    model = ir.load(str(artifact.path))
    details = QuantizeInt8WeightsDetails()
    sizes, weights, stored_bytes = set(), 0, 0
    nodes = [n for n in ir.traversal.RecursiveGraphIterator(model.graph)
             if n.op_type in ("MatMul", "Gemm", "FusedMatMul")]
    for number, node in enumerate(nodes, 1):
        path = scoped_module(node.metadata_props.get(SCOPES, ""))
        is_head = path.split(".")[-1] in HEAD_NAMES
        table = None
        if node.op_type == "FusedMatMul":  # the tied head reading the embedding's table as stored (fuse_decoder)
            weight_value = node.inputs[1] if len(node.inputs) == 2 else None
            if weight_value is None or weight_value.const_value is None or not reads_transposed(node):
                continue
            rows, has_bias, table = weight_value.const_value.numpy(), False, weight_value
        else:
            found = weight_of(node, node.graph)
            if found is None:
                continue
            rows, has_bias = found
        label = path or node.name
        if is_head and options.keep_head:
            details.kept[label] = "the output head, kept in float (keep_head)"
            continue
        n, k = rows.shape
        block = block_size_for(k, options.block_size)
        if block is None:
            details.kept[label] = f"{k} input features: no block size of {options.block_size}, 64, 32, 16 divides them"
            continue
        if number % 20 == 0 or is_head:
            context.say(f"INT8 weights: MatMul {number}/{len(nodes)}" + (f" (the output head, {n} x {k})" if is_head else ""))
        codes, scales, zeros = quantize_8bit(torch.from_numpy(np.ascontiguousarray(rows)), block, options.symmetric,
                                            options.search)
        bias = node.inputs[2].const_value.numpy() if has_bias else None
        graph = node.graph
        nbits = replace_with_nbits(graph, node, node.inputs[0], codes.numpy(), scales.numpy(), zeros.numpy(), bias,
                                   block, options.accuracy_level, (node.inputs[1].name or label), bits=8)
        sizes.add(block)
        weights += n * k
        stored_bytes += codes.numel() + scales.numel() * SCALE_BITS // 8 + (zeros.numel() if len(nbits.inputs) > 3 else 0)
        details.layers += 1
        if is_head:
            details.head = label
        if table is not None and table.uses():  # tied: the embedding's lookup reads the same table
            shared = options.tied_embedding == "shared" and share_table(graph, table, nbits, block, bits=8)
            details.embedding = "shared" if shared else "float"
    if not details.layers:
        return PassOutcome(artifact, False, ["no MatMul with a stored float weight: the graph is left as it is"], details)
    drop_unused_ir_initializers(model.graph)
    model.opset_imports["com.microsoft"] = 1
    details.block_sizes = sorted(sizes, reverse=True)
    details.bits_per_weight = round(8 * stored_bytes / weights, 3)
    (context.workdir / "int8-weights").mkdir(parents=True, exist_ok=True)
    dst = save_ir(model, context.workdir / "int8-weights" / "model.onnx")
    grid = ("symmetric, searched" if options.search else "symmetric") if options.symmetric else "asymmetric"
    notes = [f"{details.layers} MatMuls to weight-only INT8 (MatMulNBits, 8 bits, block "
             f"{'/'.join(map(str, details.block_sizes))}, {grid}; {details.bits_per_weight:g} bits per weight with the "
             "scales): activations stay in float, so their outliers are not rounded"]
    if details.head:
        notes.append(f"the output head ({details.head}) in INT8 too"
                     + ("; the tied embedding's lookup reads its INT8 table (GatherBlockQuantized): one table, "
                        "stored once" if details.embedding == "shared" else ""))
    notes += [f"kept {name} in float: {why}" for name, why in details.kept.items()]
    return PassOutcome(artifact.derive("onnx", path=dst), True, notes, details)


PASS = Pass(
    name="quantize_int8_weights",
    consumes="onnx",
    produces="onnx",
    run=run,
    options=QuantizeInt8WeightsOptions,
    details=QuantizeInt8WeightsDetails,
    description="a decoder's MatMul weights (and its head, tied embedding included) to weight-only INT8 MatMulNBits",
)
