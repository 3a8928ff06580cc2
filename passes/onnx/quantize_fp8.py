"""FP8 pass: E4M3 Q/DQ from calibration (``quantize/onnx_fp8.py``), held inside a drift budget.

Activation scales come from calibration (``amax``: the largest magnitude seen; ``percentile``: a percentile of
it, for activations with rare outliers); weights get one scale per output channel. Every layer starts in FP8; while
the budget (``--max-drift``, default the recipe's cosine) is missed on the data the build judges by, the layer
that drifts most alone goes back to float, one at a time. The model is measured on ONNX Runtime's CPU provider,
which emulates FP8: its drift is FP8's, its speed is not the GPU's, and the notes say so.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar, Literal

import numpy as np
from pydantic import Field

from infopt.core import onnx_graph
from infopt.core.artifact import Artifact
from infopt.core.errors import UsageError
from infopt.core.pass_api import Pass, PassContext, PassDetails, PassOptions, PassOutcome
from infopt.quantize import onnx_fp8, onnx_int8
from infopt.quantize.calibrate import calibrate
from infopt.quantize.observers import Observer
from infopt.quantize.sensitivity import Budget, first_samples, output_drift
from infopt.runtime.backends.onnxruntime import OrtRunner

CALIB_FIX = ("pass --calib PATH: samples shaped like the model's inputs, or a text file of sentences for a Hugging "
             "Face folder (calibration=... in the API); FP8 activation scales are calibrated")
EMULATED = "FP8 emulated by ONNX Runtime's CPU provider: the drift is FP8's, the latency is not a GPU's"


class QuantizeFp8Options(PassOptions):
    SETTINGS: ClassVar[dict[str, str]] = {"method": "calib_method", "percentile": "calib_percentile"}
    method: Literal["amax", "minmax", "percentile"] = Field(
        "amax", description="activation scales: the calibrated absolute maximum (amax; minmax is the same), or a "
                            "percentile of the magnitudes (--calib-method percentile --calib-percentile P)")
    percentile: float = Field(99.99, gt=50.0, le=100.0, description="the percentile kept by the percentile method")
    budget: str = Field("cosine_mean=0.99", description="drift budget METRIC=VALUE the fallback holds (overridden by "
                                                        "--max-drift)")
    fallback: bool = Field(True, description="move the layers that drift most back to float until the budget holds")
    sensitivity_samples: int = Field(16, ge=1, description="samples each layer's drift alone is measured on")


class Fp8Details(PassDetails):
    """What ``quantize_fp8`` records: the budget and what it measured, the scales' method, one row per layer."""

    budget: str
    measured: dict[str, Any] = Field(default_factory=dict)
    measured_on: str = ""
    method: str
    calibration_samples: int = 0
    layers: list[dict[str, Any]] = Field(default_factory=list)
    fp8_ops: dict[str, int] = Field(default_factory=dict)


def check(options: QuantizeFp8Options, target, has_calibration: bool) -> None:
    if not has_calibration:
        raise UsageError("FP8 needs calibration data for its activation scales, and none was given", fix=CALIB_FIX)


def run(artifact: Artifact, options: QuantizeFp8Options, context: PassContext) -> PassOutcome:
    import onnx

    if context.calibration is None:
        raise UsageError("FP8 needs calibration data for its activation scales, and none was given", fix=CALIB_FIX)
    model = onnx.load(str(artifact.path))
    onnx_graph.ensure_node_names(model)
    src = onnx_graph.save_model(model, context.workdir / "fp32-named.onnx")
    layers = onnx_int8.layers(model)
    if not layers:
        raise UsageError("--fp8 quantizes MatMul, Gemm and Conv layers with constant weights, and this model has none",
                         where=str(artifact.path), fix="build it at --fp16 or --bf16, or --fp32")
    del model
    context.say(f"calibrating {options.method} on {context.calibration.count} samples")
    observer = Observer("percentile" if options.method == "percentile" else "minmax", options.percentile, 2048)
    table = calibrate(src, sorted({layer.activation for layer in layers}), context.calibration, observer)
    budget = Budget.parse(context.budget or options.budget)
    batches, reference, measured_on = _judged_on(src, context)

    def build(nodes: list[str], name: str) -> Path:
        return onnx_fp8.quantize(src, context.workdir / name, layers, table.ranges, nodes)

    def drift_of(path: Path, data, ref) -> dict:
        runner = OrtRunner(path)
        outs = [runner.run(b) for b in data]
        return output_drift(ref, [np.concatenate([o[i] for o in outs]) for i in range(len(ref))])

    context.say(f"FP8 Q/DQ on {len(layers)} layers")
    fp8 = [layer.node for layer in layers]
    dst = build(fp8, "fp8.onnx")
    drift = drift_of(dst, batches, reference)
    ranked: dict[str, dict] = {}
    if not budget.holds(drift) and options.fallback:
        few = first_samples(batches, options.sensitivity_samples)
        few_ref = _first_outputs(reference, few)
        for i, layer in enumerate(layers):
            context.say(f"each layer alone in FP8: {i + 1}/{len(layers)}")
            ranked[layer.node] = drift_of(build([layer.node], "one-layer.onnx"), few, few_ref)
        order = sorted(fp8, key=lambda node: -budget.badness(ranked[node]))
        while not budget.holds(drift) and fp8:
            fp8.remove(order.pop(0))
            context.say(f"{len(layers) - len(fp8)} layer(s) back in float")
            dst = build(fp8, "fp8.onnx")
            drift = drift_of(dst, batches, reference)
    met = budget.holds(drift)
    ops = onnx_fp8.fp8_nodes(dst)
    rows = [{"layer": layer.node, "op": layer.op, "module": layer.module,
             "precision": "fp8" if layer.node in fp8 else "float (fallback)",
             budget.metric: ranked.get(layer.node, {}).get(budget.metric)} for layer in layers]
    details = Fp8Details(budget=str(budget), measured=drift, measured_on=measured_on, method=options.method,
                         calibration_samples=table.samples, layers=rows, fp8_ops=ops)
    notes = [f"FP8 E4M3 Q/DQ ({options.method} activation scales per tensor from {table.samples} calibration samples, "
             f"weights per output channel): {len(fp8)}/{len(layers)} layers"
             + (f", {len(layers) - len(fp8)} kept in float by the fallback" if len(fp8) < len(layers) else ""),
             f"budget {budget}: measured {drift.get(budget.metric):.6g} on {measured_on}"
             + ("" if met else " - NOT met even with the fallback"), EMULATED]
    result = artifact.derive("onnx", path=dst)
    result.attachments["quantization/calibration.json"] = table.save(context.workdir / "calibration.json")
    return PassOutcome(result, True, notes, details)


def _judged_on(src: Path, context: PassContext) -> tuple[list[dict], list[np.ndarray], str]:
    """(batches, reference outputs, what they are): what the build judges the shipped model by (its check batches
    against the source model's outputs) where the build passes them, else the calibration data against the FP32
    graph."""
    given, eager = list(context.check_batches or []), context.check_reference
    if given and eager:
        reference = [np.concatenate([np.asarray(outs[i]) for outs in eager]) for i in range(len(eager[0]))]
        return given, reference, f"{context.check_source}, against the source model (as the build is judged)"
    batches = list(context.calibration.batches)
    runner = OrtRunner(src)
    outs = [runner.run(b) for b in batches]
    return batches, [np.concatenate([o[i] for o in outs]) for i in range(len(outs[0]))], "calibration data"


def _first_outputs(reference: list[np.ndarray], batches: list[dict]) -> list[np.ndarray]:
    count = sum(len(next(iter(b.values()))) for b in batches)
    return [r[:count] for r in reference]


PASS = Pass(
    name="quantize_fp8",
    consumes="onnx",
    produces="onnx",
    run=run,
    options=QuantizeFp8Options,
    details=Fp8Details,
    description="FP8 E4M3 Q/DQ: calibrated per-tensor activations, per-channel weights; float fallback by drift",
    check=check,
)
