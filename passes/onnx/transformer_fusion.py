"""Transformer fusion: rewrite attention, skip/layer norms and GELU of dynamo-exported ONNX
graphs into ONNX Runtime's fused contrib ops (Attention, SkipLayerNormalization, BiasGelu...).

ONNX Runtime's own session optimizer fuses SkipLayerNormalization and BiasGelu on these graphs but
never Attention: the dynamo exporter writes attention as scaled-dot-product subgraphs its
patterns do not know. onnxscript's ``ort_fusions`` rewriter matches them (SDPA, then multi-head
attention with its bias, then the packed Attention op), so it is the tool used here. Every
fusion rule reports how often it fired; the rules that fired zero times found no matching
subgraph in this model, and the notes say so.
"""

from __future__ import annotations

from collections import Counter

from infopt.core.artifact import Artifact
from infopt.core.registry import Pass, PassContext, PassDetails, PassOptions, PassOutcome

HEADLINE = ("attention", "skip_layer_normalization", "bias_gelu", "gelu", "erf_gelu", "rotary_embedding")


def fuse(source, target) -> dict[str, int]:
    """Fuse ``source`` into ``target``; returns how often each fusion rule fired."""
    import onnx_ir as ir
    from onnxscript.rewriter import ort_fusions

    model = ir.load(str(source))
    model, counts = ort_fusions.optimize_for_ort(model)
    ir.save(model, str(target))
    return {k: int(v) for k, v in counts.items()}


def op_counts(path) -> Counter:
    import onnx

    return Counter(n.op_type for n in onnx.load(str(path), load_external_data=False).graph.node)


def run(artifact: Artifact, options: PassOptions, context: PassContext) -> PassOutcome:
    import onnx

    path = context.workdir / "fused.onnx"
    context.say("matching attention, norm and GELU patterns")
    counts = fuse(artifact.path, path)
    onnx.checker.check_model(str(path))
    fired = {k: v for k, v in counts.items() if v}
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
