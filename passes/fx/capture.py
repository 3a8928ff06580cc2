"""Capture: the model's ``nn.Module`` (or TorchScript) into an ``ExportedProgram`` with torch.export
(``exporters/torch_export.py``), the InputSpec's symbolic dims dynamic over their ranges."""

from __future__ import annotations

from pydantic import Field

from infopt.core.artifact import Artifact
from infopt.core.pass_api import Pass, PassContext, PassOptions, PassOutcome
from infopt.exporters.torch_export import export_module


class CaptureOptions(PassOptions):
    strict: bool = Field(False, description="trace with TorchDynamo (strict) instead of the Python interpreter")
    dynamic: bool = Field(True, description="keep the InputSpec's symbolic dims dynamic in the graph")


def run(artifact: Artifact, options: CaptureOptions, context: PassContext) -> PassOutcome:
    program = export_module(artifact.obj, artifact.spec, strict=options.strict, dynamic=options.dynamic)
    outputs = program.graph_signature.user_outputs
    names = artifact.output_names or tuple("output" if len(outputs) == 1 else f"output_{i}" for i in range(len(outputs)))
    notes = [f"{sum(1 for n in program.graph.nodes if n.op == 'call_function')} ops captured"]
    return PassOutcome(artifact.derive("exported", obj=program, output_names=names), True, notes)


PASS = Pass(
    name="capture",
    consumes="torch",
    produces="exported",
    run=run,
    options=CaptureOptions,
    description="torch.export the model with the InputSpec's dynamic dims",
)
