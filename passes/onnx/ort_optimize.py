"""ONNX Runtime's offline graph optimization, saved to a file.

``basic`` applies runtime-independent rewrites (constant folding, redundant node removal) and
keeps standard ONNX ops; ``extended`` adds ONNX Runtime's fusions (contrib ops such as
FusedConv, FusedGemm, SkipLayerNormalization), which are tied to the execution provider they were
made for; ``all`` adds layout changes tied to the machine it ran on. ``auto`` picks ``extended``
for CPU targets and ``basic`` for GPU targets, whose server builds its own fusions.
"""

from __future__ import annotations

from collections import Counter
from typing import Literal

from pydantic import Field

from infopt.core.artifact import Artifact
from infopt.core.registry import Pass, PassContext, PassOptions, PassOutcome
from infopt.core.threads import ort_session_options


class OrtOptimizeOptions(PassOptions):
    level: Literal["auto", "basic", "extended", "all"] = Field("auto", description="ONNX Runtime graph optimization level")


def op_histogram(path) -> Counter:
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    return Counter(n.op_type if not n.domain or n.domain == "ai.onnx" else f"{n.domain}.{n.op_type}" for n in model.graph.node)


def optimize(source, target_path, level: str) -> None:
    import onnx
    import onnxruntime as ort

    levels = {"basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
              "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
              "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL}
    options = ort_session_options()
    options.graph_optimization_level = levels[level]
    options.optimized_model_filepath = str(target_path)
    ort.InferenceSession(str(source), options, providers=["CPUExecutionProvider"])
    onnx.checker.check_model(str(target_path))


def run(artifact: Artifact, options: OrtOptimizeOptions, context: PassContext) -> PassOutcome:
    level = options.level
    if level == "auto":
        level = "extended" if context.target.device == "cpu" else "basic"
    path = context.workdir / "optimized.onnx"
    optimize(artifact.path, path, level)
    before, after = op_histogram(artifact.path), op_histogram(path)
    gained = {op: n for op, n in (after - before).items()}
    notes = [f"level {level}: {sum(before.values())} -> {sum(after.values())} nodes"]
    if gained:
        notes.append("new ops: " + ", ".join(f"{op} x{n}" for op, n in sorted(gained.items())))
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
