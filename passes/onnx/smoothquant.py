"""SmoothQuant pass: even out activation channels of MatMul/Gemm layers before static INT8.

Needs calibration data for the per-channel activation maxima; without it (dynamic INT8, which
quantizes activations per batch at run time) the pass does nothing and says so.
"""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field

from infopt.core import onnx_graph
from infopt.core.artifact import Artifact
from infopt.core.pass_api import Pass, PassContext, PassDetails, PassOptions, PassOutcome
from infopt.quantize import onnx_int8, smoothquant
from infopt.quantize.calibrate import calibrate
from infopt.quantize.observers import Observer


class SmoothQuantOptions(PassOptions):
    SETTINGS: ClassVar[dict[str, str]] = {"alpha": "smoothquant_alpha"}
    alpha: float = Field(
        0.5, ge=0.0, le=1.0, description="migration strength: 0 keeps the weights, 1 moves all of the activation range into them")
    min_outlier_ratio: float = Field(
        8.0, ge=0.0, description="smooth an activation only if its largest channel maximum is this many times the median one (0: all)")
    fold_only: bool = Field(False, description="only smooth activations whose LayerNorm can absorb the scale (no extra Mul nodes)")


def run(artifact: Artifact, options: SmoothQuantOptions, context: PassContext) -> PassOutcome:
    import onnx

    if context.calibration is None:
        return PassOutcome(artifact, False, ["skipped: no calibration data (SmoothQuant serves static INT8)"])
    model = onnx.load(str(artifact.path))
    groups = smoothquant.smoothable(onnx_int8.layers(model))
    if not groups:
        return PassOutcome(artifact, False, ["no MatMul/Gemm layers with constant weights to smooth"])
    context.say(f"activation channel maxima of {len(groups)} tensors")
    table = calibrate(artifact.path, [], context.calibration, Observer("minmax"), channel_tensors=sorted(groups))
    result = smoothquant.smooth(model, groups, table.channel_absmax, alpha=options.alpha, fold_only=options.fold_only,
                                min_outlier_ratio=options.min_outlier_ratio)
    if not result.groups:
        return PassOutcome(artifact, False, [f"no layer group could be smoothed (none has a channel outlier "
                                             f"ratio of {options.min_outlier_ratio:g} or more)"])
    path = onnx_graph.save_model(model, context.workdir / "smoothed.onnx")
    notes = [f"alpha {options.alpha:g}: {result.layers} layers in {result.groups} groups; "
             f"{result.folded} scales folded into LayerNorm, {result.inserted} Mul nodes inserted"]
    details = SmoothQuantDetails(alpha=options.alpha, groups=result.groups, layers=result.layers, folded=result.folded,
                                 inserted=result.inserted, calibration_cached=table.cached)
    return PassOutcome(artifact.derive("onnx", path=path), True, notes, details)



class SmoothQuantDetails(PassDetails):
    """What ``smoothquant`` records: the layers smoothed and how the scales went in."""

    alpha: float
    groups: int
    """layer groups sharing one input (Q, K and V are one group)"""
    layers: int
    folded: int
    """scales folded into the LayerNorm before a group"""
    inserted: int
    """Mul nodes inserted where there was nothing to fold into"""
    calibration_cached: bool


PASS = Pass(
    name="smoothquant",
    consumes="onnx",
    produces="onnx",
    run=run,
    details=SmoothQuantDetails,
    options=SmoothQuantOptions,
    description="SmoothQuant: migrate activation outliers into MatMul/Gemm weights before static INT8",
)
