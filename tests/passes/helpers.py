"""Helpers for pass tests: capture a module, run a program, save and check it as ONNX."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import onnx
import torch

from infopt.core.artifact import Artifact
from infopt.core.inputspec import InputSpec
from infopt.core.registry import PassContext, get_pass
from infopt.core.target import get_target
from infopt.exporters.torch_export import export_module
from infopt.passes.lower.onnx_export import export_onnx


def capture(module: torch.nn.Module, spec: str, dims=()) -> Artifact:
    s = InputSpec.parse([spec] if isinstance(spec, str) else spec, list(dims))
    program = export_module(module.eval(), s)
    return Artifact("exported", s, obj=program, output_names=("output",))


def ops(program) -> Counter:
    return Counter(str(n.target) for n in program.graph.nodes if n.op == "call_function")


def run_pass(name: str, artifact: Artifact, tmp_path: Path, **options):
    definition = get_pass(name)
    return definition.run(artifact, definition.parse_options(options), PassContext(get_target("cpu"), tmp_path))


def saved_and_checked(program, spec: InputSpec, path: Path) -> onnx.ModelProto:
    """Serialize the program as ONNX and run the full checker on the file."""
    export_onnx(program, path, spec.names, ("output",))
    onnx.checker.check_model(str(path), full_check=True)
    return onnx.load(str(path))
