"""Transformer fusion: rewrite attention, skip/layer norms and GELU of dynamo-exported ONNX
graphs into ONNX Runtime's fused contrib ops (Attention, SkipLayerNormalization, BiasGelu...).

ONNX Runtime's own session optimizer fuses SkipLayerNormalization and BiasGelu on these graphs but
never Attention: the dynamo exporter writes attention as scaled-dot-product subgraphs its
patterns do not know. onnxscript's ``ort_fusions`` rewriter matches them (SDPA, then multi-head
attention with its bias, then the packed Attention op), so it is the tool used here. Every
fusion rule reports how often it fired; the rules that fired zero times found no matching
subgraph in this model, and the notes say so.

The fused graph must open in ONNX Runtime with all its optimizations. Where it does not (on GPT-2,
whose Conv1D layers export as ``Gemm`` behind a 2-D reshape, ONNX Runtime's optimizer ends with a
``Gemm`` fed a rank-3 tensor after these rewrites), the pass leaves the graph unfused and says why,
rather than failing the candidate.
ONNX Runtime's own ops in the default domain (``SimplifiedLayerNormalization`` for the RMSNorm of
Llama-family models), which onnx's checker has no schema for, are judged by ONNX Runtime too
(:mod:`infopt.passes.onnx.checks`).
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from infopt.core import onnx_graph
from infopt.core.artifact import Artifact
from infopt.core.pass_api import Pass, PassContext, PassDetails, PassOptions, PassOutcome
from infopt.passes.onnx.checks import onnxruntime_refuses

HEADLINE = ("attention", "skip_layer_normalization", "bias_gelu", "gelu", "erf_gelu", "rotary_embedding")


def fuse(source, target) -> dict[str, int]:
    """Fuse ``source`` into ``target``; returns how often each fusion rule fired."""
    import onnx_ir as ir
    from onnxscript.rewriter import ort_fusions

    model = ir.load(str(source))
    model, counts = ort_fusions.optimize_for_ort(model)
    onnx_graph.save_ir(model, Path(target))
    return {k: int(v) for k, v in counts.items()}


def fuse_norms_and_rotary(source):
    """Only the norm and rotary fusions of ``fuse``, for a graph whose attention is fused already (the KV
    decoder's): ONNX Runtime's ``(Skip)SimplifiedLayerNormalization``, ``SkipLayerNormalization`` and
    ``RotaryEmbedding``; returns the ``onnx.ModelProto`` (for the caller's further rewrites, saved once) and
    how often each rule fired. The MatMul rewrites are left out: a head tied to the embedding would become a
    ``FusedMatMul`` with ``transB``, which ONNX Runtime's CPU kernel runs several times slower than the
    ``MatMul`` whose transposed weight its optimizer folds."""
    import onnx_ir as ir
    import onnx_ir.passes.common as common_passes
    from onnxscript.optimizer import optimize
    from onnxscript.rewriter.ort_fusions import cos_sin_cache, rms_normalization, rotary_embedding, skip_normalization

    model = ir.load(str(source))
    common_passes.ShapeInferencePass()(model)
    optimize(model)
    counts = {"rms_normalization": rms_normalization.fuse_rms_normalization(model),
              "skip_layer_normalization": skip_normalization.fuse_skip_layer_normalization(model),
              "skip_rms_normalization": skip_normalization.fuse_skip_rms_normalization(model),
              "rotary_embedding": rotary_embedding.fuse_rotary_embedding(model),
              "cos_sin_cache": cos_sin_cache.fuse_cos_sin_cache(model),
              "partial_rotary_embedding": rotary_embedding.fuse_partial_rotary_embedding(model)}
    optimize(model)
    return ir.serde.serialize_model(model), {k: int(v) for k, v in counts.items()}


def op_counts(path) -> Counter:
    import onnx

    return Counter(n.op_type for n in onnx.load(str(path), load_external_data=False).graph.node)


def run(artifact: Artifact, options: PassOptions, context: PassContext) -> PassOutcome:

    path = context.workdir / "fused.onnx"
    context.say("matching attention, norm and GELU patterns")
    counts = fuse(artifact.path, path)
    fired = {k: v for k, v in counts.items() if v}
    # the check: ONNX Runtime opens it with all its optimizations, as ort_optimize and the server will
    refused = onnxruntime_refuses(path, optimize=True) if fired else None
    if refused:  # a rewrite whose pattern did not really hold (GPT-2's Conv1D Gemm lost its 2-D reshape)
        notes = [f"fusions not applied: ONNX Runtime refuses the fused graph ({refused[:300]}); the graph stays "
                 f"unfused (matched: {', '.join(f'{k} x{v}' for k, v in fired.items())})"]
        return PassOutcome(artifact, False, notes, FusionDetails(fusions=counts, ops=dict(op_counts(artifact.path))))
    missed = [k for k in HEADLINE if k in counts and not counts[k]]
    notes = ["fused: " + (", ".join(f"{k} x{v}" for k, v in fired.items()) or "nothing")]
    if missed:
        notes.append("no matching subgraph for: " + ", ".join(missed))
    details = FusionDetails(fusions=counts, ops=dict(op_counts(path)))
    if not fired:  # keep the input file itself, so an unchanged model stays byte-identical
        return PassOutcome(artifact, False, notes, details)
    return PassOutcome(artifact.derive("onnx", path=path), True, notes, details)



class FusionDetails(PassDetails):
    """What ``transformer_fusion`` records: how often each fusion fired, and the graph's op counts after it."""

    fusions: dict[str, int]
    ops: dict[str, int]


PASS = Pass(
    name="transformer_fusion",
    consumes="onnx",
    produces="onnx",
    run=run,
    details=FusionDetails,
    description="fuse attention, skip/layer norm and GELU into ONNX Runtime contrib ops (onnxscript ort_fusions)",
)
