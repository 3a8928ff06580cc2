"""A decoder's own embedding table to 4 or 8 bits (``onnx -> onnx``): ``Gather`` -> ``GatherBlockQuantized``.

A head tied to the embedding already shares its quantized table with the lookup (``quantize_int8_weights``,
``quantize_int4_head``). An untied embedding, as most LLMs from 7B up have (Llama-3-8B's is 525 M parameters, 2.1 GB
in float32), was left in float: this pass rounds each float table read only by ``Gather`` lookups, in blocks of
``block_size`` along a row, on the searched grid at 4 bits (``rtn.rtn_quantize``) or the searched symmetric grid at 8
(``int8_weights.quantize_8bit``), and has every lookup read the codes (``GatherBlockQuantized``). A lookup rounds one
row per token, so the table costs the model little accuracy: what it costs on the real SmolLM2 is in
``benchmarks/results/real_llm.md``.
"""

from __future__ import annotations

import warnings
from typing import Literal

from pydantic import Field

from infopt.core.artifact import Artifact
from infopt.core.onnx_graph import save_ir
from infopt.core.pass_api import Pass, PassContext, PassDetails, PassOptions, PassOutcome
from infopt.passes.decoder.quantize_int4_head import block_quantized_lookups
from infopt.passes.lower.onnx_int4 import block_size_for
from infopt.quantize.int8_weights import quantize_8bit
from infopt.quantize.layer_choice import SCALE_BITS
from infopt.quantize.rtn import rtn_quantize

FLOAT_TYPES = ("FLOAT", "FLOAT16", "BFLOAT16")


class QuantizeEmbeddingOptions(PassOptions):
    bits: Literal[4, 8] = Field(8, description="bits per code of the table")
    block_size: int = Field(32, description="a row's entries per scale and zero point (the largest of this, 64, 32 "
                                            "and 16 that divides the row)")


class QuantizeEmbeddingDetails(PassDetails):
    tables: dict[str, list[int]] = Field(default_factory=dict)
    """each rounded table's name and shape"""
    bits: int | None = None
    block_size: int | None = None
    bits_per_weight: float | None = None
    """the rounded tables' bytes (codes, float16 scales as ``half_scales`` stores them, zero points) over their
    entries, in bits"""


def run(artifact: Artifact, options: QuantizeEmbeddingOptions, context: PassContext) -> PassOutcome:
    import numpy as np
    import onnx_ir as ir
    import torch

    model = ir.load(str(artifact.path))
    details = QuantizeEmbeddingDetails(bits=options.bits)
    entries = stored = 0
    for table in list(model.graph.initializers.values()):
        uses = table.uses()
        if (table.const_value is None or table.shape is None or len(table.shape) != 2 or not uses
                or table.dtype is None or table.dtype.name not in FLOAT_TYPES
                or any(node.op_type != "Gather" or index != 0 for node, index in uses)):
            continue
        rows, width = (int(d) for d in table.shape)
        block = block_size_for(width, options.block_size)
        if block is None:
            continue
        context.say(f"the embedding table {table.name} ({rows} x {width}) to {options.bits} bits")
        with warnings.catch_warnings():  # the table maps its file read-only; it is only read, never copied whole
            warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
            values = torch.from_numpy(np.ascontiguousarray(table.const_value.numpy()))
        if options.bits == 4:
            packed = rtn_quantize(values, block, symmetric=False, read_only_file=True)
            codes, scales, zeros = packed.qweight.numpy(), packed.scales.numpy(), packed.zeros.numpy()
        else:
            codes, scales, zeros = (t.numpy() for t in quantize_8bit(values, block))
        data = codes.reshape(rows, width // block, block * options.bits // 8)
        tensor = ir.tensor(np.ascontiguousarray(data))
        weight = ir.Value(name=f"{table.name}.quantized", type=ir.TensorType(tensor.dtype), shape=tensor.shape,
                          const_value=tensor)
        model.graph.register_initializer(weight)
        if np.all(zeros == 1 << (options.bits - 1)):  # the op's default zero point: none stored
            zeros = None
        block_quantized_lookups(model.graph, table, weight, scales.astype(table.dtype.numpy()), zeros, block,
                                options.bits)
        if not table.uses():
            model.graph.initializers.pop(table.name, None)
        details.tables[table.name] = [rows, width]
        details.block_size = block
        entries += rows * width
        stored += data.size + scales.size * SCALE_BITS // 8 + (0 if zeros is None else zeros.size)
    if not details.tables:
        return PassOutcome(artifact, False, ["no float table read only by Gather lookups: the graph is left as it is"],
                           details)
    model.opset_imports["com.microsoft"] = 1
    details.bits_per_weight = round(8 * stored / entries, 3)
    (context.workdir / "embedding").mkdir(parents=True, exist_ok=True)
    dst = save_ir(model, context.workdir / "embedding" / "model.onnx")
    names = ", ".join(f"{name} ({r} x {w})" for name, (r, w) in details.tables.items())
    note = (f"the embedding table {names} to {options.bits} bits in blocks of {details.block_size} "
            f"({details.bits_per_weight:g} bits per entry with the scales): its lookup reads the codes "
            "(GatherBlockQuantized)")
    return PassOutcome(artifact.derive("onnx", path=dst), True, [note], details)


PASS = Pass(
    name="quantize_embedding",
    consumes="onnx",
    produces="onnx",
    run=run,
    options=QuantizeEmbeddingOptions,
    details=QuantizeEmbeddingDetails,
    description="a decoder's untied embedding table to 4 or 8 bits, read by GatherBlockQuantized",
)
