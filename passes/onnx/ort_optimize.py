"""ONNX Runtime's offline graph optimization, saved to a file.

``basic`` applies runtime-independent rewrites (constant folding, redundant node removal) and
keeps standard ONNX ops; ``extended`` adds ONNX Runtime's fusions (contrib ops such as
FusedConv, FusedGemm, SkipLayerNormalization), which are tied to the execution provider they were
made for; ``all`` adds layout changes tied to the machine it ran on. ``auto`` picks ``extended``
for CPU targets and ``basic`` for GPU targets, whose server builds its own fusions.

On a CPU target the fused SkipLayerNormalization nodes are then timed against Sum +
LayerNormalization on this machine and taken back apart when the pair is faster
(``skip_layernorm.py``).
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Literal

from pydantic import Field

from infopt.core import onnx_graph
from infopt.core.artifact import Artifact
from infopt.core.pass_api import Pass, PassContext, PassOptions, PassOutcome
from infopt.core.threads import ort_session_options
from infopt.passes.onnx import skip_layernorm
from infopt.passes.onnx.checks import check_for_onnxruntime


class OrtOptimizeOptions(PassOptions):
    level: Literal["auto", "basic", "extended", "all"] = Field("auto", description="ONNX Runtime graph optimization level")
    skip_layernorm: Literal["measure", "keep", "unfuse"] = Field(
        "measure", description="CPU targets: SkipLayerNormalization kept, unfused into Sum + LayerNormalization, or "
                               "whichever times faster here")


def op_histogram(path) -> Counter:
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    return Counter(n.op_type if not n.domain or n.domain == "ai.onnx" else f"{n.domain}.{n.op_type}" for n in model.graph.node)


def optimize(source, target_path, level: str) -> None:
    import onnxruntime as ort

    levels = {"basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
              "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
              "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL}
    options = ort_session_options()
    options.graph_optimization_level = levels[level]
    options.optimized_model_filepath = str(target_path)
    if onnx_graph.has_external_data(Path(source)):  # written beside the target: the source's file is not beside it
        options.add_session_config_entry("session.optimized_model_external_initializers_file_name",
                                         Path(target_path).name + ".data")
        options.add_session_config_entry("session.optimized_model_external_initializers_min_size_in_bytes", "1024")
    ort.InferenceSession(str(source), options, providers=["CPUExecutionProvider"])
    check_for_onnxruntime(target_path)


def unfuse_skip_layernorm(path, measure: bool) -> list[str]:
    """Unfuse the model's SkipLayerNormalization nodes in place when told to or when the pair times faster
    here; the notes say what was measured and done."""
    model = onnx_graph.load_graph(path)  # the graph only: the nodes change, the tensors do not
    nodes = skip_layernorm.fused_nodes(model)
    if not nodes:
        return []
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
    if opset < 17:
        return [f"{len(nodes)} {skip_layernorm.FUSED} kept: LayerNormalization needs opset 17, the model has {opset}"]
    timing = None
    if measure:
        hidden = skip_layernorm.hidden_size(model, nodes[0])
        if hidden is None:
            return [f"{len(nodes)} {skip_layernorm.FUSED} kept: the normalized size is not a constant, nothing to time"]
        timing = skip_layernorm.measure(hidden, skip_layernorm.node_epsilon(nodes[0]))
        if not timing.unfuse:
            return [f"{len(nodes)} {skip_layernorm.FUSED} kept: {timing}"]
    count = skip_layernorm.unfuse(model)
    onnx_graph.save_graph(model, path, path)
    check_for_onnxruntime(path)
    return [f"{count} {skip_layernorm.FUSED} unfused into Sum + LayerNormalization" + (f": {timing}" if timing else "")]


def run(artifact: Artifact, options: OrtOptimizeOptions, context: PassContext) -> PassOutcome:
    level = options.level
    if level == "auto":
        level = "extended" if context.target.device == "cpu" else "basic"
    path = context.workdir / "optimized.onnx"
    optimize(artifact.path, path, level)
    unfused = []
    if context.target.device == "cpu" and options.skip_layernorm != "keep":
        unfused = unfuse_skip_layernorm(path, options.skip_layernorm == "measure")
    before, after = op_histogram(artifact.path), op_histogram(path)
    gained = {op: n for op, n in (after - before).items()}
    notes = [f"level {level}: {sum(before.values())} -> {sum(after.values())} nodes"]
    if gained:
        notes.append("new ops: " + ", ".join(f"{op} x{n}" for op, n in sorted(gained.items())))
    notes += unfused
    changed = before != after
    return PassOutcome(artifact.derive("onnx", path=path), changed, notes)


PASS = Pass(
    name="ort_optimize",
    consumes="onnx",
    produces="onnx",
    run=run,
    options=OrtOptimizeOptions,
    description="ONNX Runtime offline graph optimization, saved to a file",
)
