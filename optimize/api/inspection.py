"""``infopt inspect``: what a model file holds: format, inputs, outputs, parameters, op histogram."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any, Sequence

from infopt.api.logits_flow import check_forward, reference_runner, resolve_spec
from infopt.exporters.torch_export import export_module
from infopt.runtime.loading import load_model


def inspect_model(path: str | Path, *, inputs: Sequence[str] | None = None, dims: Sequence[str] | None = None,
                  model_class: str | None = None, model_args: str | None = None, allow_pickle: bool = False,
                  val: str | Path | None = None) -> dict[str, Any]:

    loaded = load_model(path, model_class=model_class, model_args=model_args, allow_pickle=allow_pickle)
    spec = resolve_spec(loaded, inputs, dims, None, val)
    _, outputs = check_forward(reference_runner(loaded, spec), spec, loaded.module)
    info: dict[str, Any] = {"path": str(path), "format": loaded.format, "inputs": spec.to_json(),
                            "outputs": [{"name": n, "dtype": str(o.dtype), "shape_at_opt": list(o.shape)}
                                        for n, o in zip(_names(loaded, len(outputs)), outputs)]}
    if loaded.format == "onnx":
        import onnx

        model = onnx.load(str(path), load_external_data=False)
        from onnx import numpy_helper

        info["parameters"] = int(sum(numpy_helper.to_array(t).size for t in model.graph.initializer))
        info["ops"] = dict(Counter(n.op_type for n in model.graph.node).most_common())
        info["graph"] = "onnx"
        return info
    program = loaded.artifact.obj if loaded.format == "pt2" else None
    if program is None:
        program = export_module(loaded.module, spec)
    info["parameters"] = int(sum(t.numel() for t in program.state_dict.values()))
    info["ops"] = dict(Counter(str(n.target).replace("aten.", "") for n in program.graph.nodes
                               if n.op == "call_function").most_common())
    info["graph"] = "torch.export (ATen ops)"
    return info


def _names(loaded, count: int) -> list[str]:
    if loaded.artifact is not None and len(loaded.artifact.output_names) == count:
        return list(loaded.artifact.output_names)
    return ["output"] if count == 1 else [f"output_{i}" for i in range(count)]
