"""The output head of a KV decoder to INT4 on the graph (``onnx -> onnx``): RTN ``MatMulNBits``.

``quantize_int4`` leaves the head (``lm_head``) in float, since its logits pick every token; in a small LM it
is nonetheless the largest layer, read for every token, so this pass rounds it afterwards (RTN, asymmetric),
as ONNX Runtime GenAI's builder does too. A head tied to the embedding (``MatMul(x, Transpose(embedding))``)
is rounded from the embedding's table. The group size is the largest the other INT4 layers got (their
``MatMulNBits`` ``block_size``), else the option's.
"""

from __future__ import annotations

from pydantic import Field

from infopt.core.artifact import Artifact
from infopt.core.onnx_graph import save_ir
from infopt.core.registry import Pass, PassContext, PassDetails, PassOptions, PassOutcome
from infopt.passes.lower.onnx_int4 import replace_with_nbits
from infopt.quantize.int4_format import HEAD_NAMES
from infopt.quantize.rtn import rtn_quantize


class QuantizeInt4HeadOptions(PassOptions):
    group_size: int = Field(128, description="the group size when no other layer is INT4 (else theirs)")
    accuracy_level: int = Field(4, ge=0, le=4, description="MatMulNBits accuracy_level: 4 quantizes the activations "
                                                           "to int8 per block inside the op (fastest on CPU)")


class QuantizeInt4HeadDetails(PassDetails):
    head: str | None = None
    """the head's module path; None when it is not a MatMul with a stored weight"""
    shape: list[int] = Field(default_factory=list)
    group_size: int | None = None


def run(artifact: Artifact, options: QuantizeInt4HeadOptions, context: PassContext) -> PassOutcome:
    import numpy as np
    import onnx_ir as ir
    import torch

    model = ir.load(str(artifact.path))
    blocks = [node.attributes["block_size"].as_int() for node in model.graph
              if node.op_type == "MatMulNBits" and "block_size" in node.attributes]
    group_size = max(blocks) if blocks else options.group_size
    for node in list(model.graph):
        scopes = node.metadata_props.get("pkg.torch.onnx.name_scopes", "")
        named = [s.strip(" '\"") for s in scopes.strip("[]").split(",")][:-1]
        weight = node.inputs[1] if node.op_type == "MatMul" and len(node.inputs) == 2 else None
        if not named or named[-1].split(".")[-1] not in HEAD_NAMES or weight is None:
            continue
        transpose = weight.producer()  # a head tied to the embedding: MatMul(x, Transpose(embedding))
        if weight.const_value is not None:
            rows = weight.const_value.numpy().T  # MatMul's [K, N] as the Linear's [N, K]
        elif transpose is not None and transpose.op_type == "Transpose" and transpose.inputs[0].const_value is not None:
            rows = transpose.inputs[0].const_value.numpy()
        else:
            continue
        rows = torch.from_numpy(np.ascontiguousarray(rows)).float()
        size = next((g for g in (group_size, 64, 32, 16) if g <= group_size and rows.shape[1] % g == 0), None)
        if size is None:
            return PassOutcome(artifact, False, [f"the output head stays in float: no group size divides its "
                                                 f"{rows.shape[1]} inputs"],
                               QuantizeInt4HeadDetails(head=named[-1], shape=list(rows.shape)))
        context.say(f"the output head ({named[-1]}) to INT4")
        packed = rtn_quantize(rows, size, symmetric=False)
        replace_with_nbits(model.graph, node, node.inputs[0], packed.qweight.numpy(), packed.scales.numpy(),
                           packed.zeros.numpy(), None, size, options.accuracy_level, named[-1])
        if weight.const_value is None and not weight.uses():
            model.graph.remove(transpose, safe=True)
        elif not weight.uses():
            model.graph.initializers.pop(weight.name, None)
        (context.workdir / "head-int4").mkdir(parents=True, exist_ok=True)
        dst = save_ir(model, context.workdir / "head-int4" / "model.onnx")
        return PassOutcome(artifact.derive("onnx", path=dst), True,
                           [f"the output head ({named[-1]}, {rows.shape[0]} x {rows.shape[1]}) to INT4 by RTN, group "
                            f"size {size}: the largest layer of a small LM, read for every token"],
                           QuantizeInt4HeadDetails(head=named[-1], shape=list(rows.shape), group_size=size))
    return PassOutcome(artifact, False, ["the output head is not a MatMul with a stored weight: left as it is"],
                       QuantizeInt4HeadDetails())


PASS = Pass(
    name="quantize_int4_head",
    consumes="onnx",
    produces="onnx",
    run=run,
    options=QuantizeInt4HeadOptions,
    details=QuantizeInt4HeadDetails,
    description="a decoder's output head (lm_head, or the tied embedding) to INT4 MatMulNBits by RTN, on the graph",
)
