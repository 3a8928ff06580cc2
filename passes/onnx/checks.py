"""The check an ONNX Runtime graph gets after each rewrite: onnx's checker, and ONNX Runtime itself
where onnx's checker cannot judge.

ONNX Runtime registers some of its own ops in the default ONNX domain (``SimplifiedLayerNormalization``
and ``SkipSimplifiedLayerNormalization``, which its fusions and onnxscript's write for the RMSNorm of
Llama-family models). onnx's checker rejects those though ONNX Runtime, the graph's consumer, runs
them. So where the checker names an op it has no schema for, the graph is loaded into an ONNX Runtime
session instead (no optimizations, CPU): if that session opens, the graph passes; if not, the error
says both.
"""

from __future__ import annotations

from infopt.core.threads import ort_session_options

UNJUDGED = "No Op registered for"
"""The checker's message for an op its schemas do not cover, where ONNX Runtime's word counts."""


def check_for_onnxruntime(model) -> None:
    """Raise ValueError when ``model`` (a ModelProto or a path) is not a graph ONNX Runtime loads."""
    import onnx

    try:
        onnx.checker.check_model(model if isinstance(model, onnx.ModelProto) else str(model))
        return
    except onnx.checker.ValidationError as exc:
        if UNJUDGED not in str(exc):
            raise
        checker_said = str(exc).strip().splitlines()[0]
    refused = onnxruntime_refuses(model)
    if refused:
        raise ValueError(f"onnx's checker: {checker_said}; ONNX Runtime: {refused}")


def onnxruntime_refuses(model, optimize: bool = False) -> str | None:
    """Why ONNX Runtime will not open ``model`` (a ModelProto or a path) in a quiet CPU session, with
    no graph optimizations or (``optimize``) all of them but constant folding, or None when it opens.

    Opening is the question, so no weight is copied: no prepacking, and no folding, which at Qwen2.5-0.5B's
    shape transposed the tied float32 head (545 MB) and took 1.28 s and 1.1 GB against 0.04 s and 64 MB
    without it. The session the model is served from folds them, and whoever opens it next (the build's
    validation) says so if that fails."""
    import onnx
    import onnxruntime as ort

    source = model.SerializeToString() if isinstance(model, onnx.ModelProto) else str(model)
    options = ort_session_options(optimize=optimize)
    options.add_session_config_entry("session.disable_prepacking", "1")
    try:
        ort.InferenceSession(source, options, providers=["CPUExecutionProvider"],
                             disabled_optimizers=["ConstantFolding"] if optimize else None)
    except Exception as exc:  # noqa: BLE001 - ONNX Runtime's own word on the graph
        return str(exc).strip().splitlines()[0]
    return None
