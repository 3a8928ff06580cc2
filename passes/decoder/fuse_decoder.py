"""Fusions and plumbing of an exported KV decoder (``onnx -> onnx``): what makes it run as fast as ONNX
Runtime's own decoders.

- dims named as ONNX Runtime GenAI names them (``batch_size``, ``sequence_length``, ...);
- RMSNorm (with its residual add) as ONNX Runtime's fused norm ops (``passes/onnx/transformer_fusion.py``);
- sibling projections (query/key/value, gate/up; float or ``MatMulNBits``) packed into one MatMul each
  (``passes/onnx/fuse_matmuls.py``), where the export has not packed them as it wrote a stamped decoder
  (``passes/lower/onnx_pack.py``): then the rewrites change only the graph, and the export's tensors' file is
  taken over rather than copied (``core/tensor_file.py``);
- the Reshape chains between the projections and the attention collapsed, and the attention fed the packed
  query/key/value; a head tied to the embedding reading its table as stored (``FusedMatMul`` with ``transB``), not
  a transpose ONNX Runtime would fold as it opens the model (``passes/decoder/plumbing.py``).

The result must open in ONNX Runtime with every optimization; where it does not, the decoder goes on as
exported and the note says why.
"""

from __future__ import annotations

from pydantic import Field

from infopt.core.artifact import Artifact
from infopt.core.errors import BuildError
from infopt.core.logs import quiet_third_party
from infopt.core.memory import release as release_memory
from infopt.core.pass_api import Pass, PassContext, PassDetails, PassOptions, PassOutcome
from infopt.core.tensor_file import tensor_store
from infopt.exporters import kv_decoder
from infopt.passes.decoder import plumbing
from infopt.passes.onnx import fuse_matmuls, transformer_fusion
from infopt.passes.onnx.checks import onnxruntime_refuses


class FuseDecoderDetails(PassDetails):
    """How often each fusion and rewrite fired, and why none applied if ONNX Runtime refused the result."""

    fused: dict[str, int] = Field(default_factory=dict)
    """ONNX Runtime's fused ops written, by fusion rule"""
    rewrites: dict[str, int] = Field(default_factory=dict)
    refused: str | None = None


def run(artifact: Artifact, options: PassOptions, context: PassContext) -> PassOutcome:
    decoder = artifact.products.get(kv_decoder.KvDecoder)
    if decoder is None:
        raise BuildError("fuse_decoder needs the decoder captured by capture_kv_decoder",
                         fix="put capture_kv_decoder before onnx_export in the recipe")
    source = artifact.path
    kv_decoder.name_dims(source, decoder.layout)
    context.say("fusing the decoder's norms and packing its projections")
    with quiet_third_party():
        model, counts = transformer_fusion.fuse_norms_and_rotary(source)
    dst = context.workdir / "decoder-fused" / "model.onnx"
    # tensors kept beside the graph stay in their file: the packs are written as they are made, the rest copied; or,
    # where the export packed the projections as it wrote them and nothing is added, its file is moved here
    with tensor_store(model, source, dst, take_over=context.in_work_folder(source)) as tensors:
        fired = {k: v for k, v in counts.items() if v}
        rewrites = {"reshape chains collapsed": plumbing.collapse_reshapes(model),
                    "projections packed": fuse_matmuls.fuse(model, tensors) + fuse_matmuls.fuse_nbits(model, tensors)}
        rewrites["attention ops taking packed QKV"] = plumbing.packed_attention_inputs(model)
        rewrites["heads reading the embedding's table"] = plumbing.heads_read_tables(model)
        rewrites = {k: v for k, v in rewrites.items() if v}
        if not fired and not rewrites:
            return PassOutcome(artifact, False, ["no norm, projection or reshape pattern to fuse"], FuseDecoderDetails())
        fused = tensors.save()
    del model
    release_memory()  # the graph's protobuf, before ONNX Runtime loads the fused model to check it
    refused = onnxruntime_refuses(fused, optimize=True)
    if refused:
        tensors.give_back()
        return PassOutcome(artifact, False, [f"fusions not applied: ONNX Runtime refuses the fused graph ({refused[:200]})"],
                           FuseDecoderDetails(refused=refused[:500]))
    notes = ["fused as ONNX Runtime's ops: " + ", ".join(f"{k} x{v}" for k, v in fired.items())] if fired else []
    notes.append("; ".join(f"{k} x{v}" for k, v in rewrites.items()))
    return PassOutcome(artifact.derive("onnx", path=fused), True, [n for n in notes if n],
                       FuseDecoderDetails(fused=fired, rewrites=rewrites))


PASS = Pass(
    name="fuse_decoder",
    consumes="onnx",
    produces="onnx",
    run=run,
    details=FuseDecoderDetails,
    description="a KV decoder's norms fused, sibling projections packed, the reshapes before its attention collapsed",
)
