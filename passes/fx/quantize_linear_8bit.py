"""FP8 or INT8 Linear layers for stock PyTorch (``quantize/linear_8bit.py``), on the module before capture: the
route a CUDA target takes without TensorRT (``fp8-inductor``, ``int8-inductor``), compiled by AOTInductor. The
same program runs on the CPU (torch 2.13 has both ops there), which is where its drift is checked on a machine
without a GPU (``--recipe fp8-inductor --target cpu``)."""

from __future__ import annotations

import copy
from typing import Literal

from pydantic import Field

from infopt.core.artifact import Artifact
from infopt.core.pass_api import Pass, PassContext, PassDetails, PassOptions, PassOutcome
from infopt.quantize.linear_8bit import swap

HOW = {"fp8": "FP8 E4M3 weights per output channel, activations per tensor per call (torch._scaled_mm)",
       "int8": "INT8 weights per output channel, activations per row per call (torch._int_mm, W8A8 dynamic)"}


class QuantizeLinear8bitOptions(PassOptions):
    precision: Literal["fp8", "int8"] = Field("fp8", description="the layers' 8-bit format")
    keep_float: list[str] = Field(default_factory=lambda: ["lm_head"],
                                  description="Linear layers that stay in float, by the last part of their path")


class Linear8bitDetails(PassDetails):
    precision: str
    swapped: list[str] = Field(default_factory=list)
    kept: list[str] = Field(default_factory=list)
    device: str = "cpu"


def run(artifact: Artifact, options: QuantizeLinear8bitOptions, context: PassContext) -> PassOutcome:
    model = copy.deepcopy(artifact.obj).eval()
    device = context.target.device
    swapped, kept = swap(model, options.precision, device, tuple(options.keep_float))
    notes = [f"{len(swapped)} Linear layers to {HOW[options.precision]}"]
    notes += [f"kept {name}" for name in kept]
    if device != "cpu":
        notes.append(f"the same program runs on the CPU where this machine has no GPU; {options.precision} there is "
                     "torch's CPU kernel, so only the drift says something of the target")
    details = Linear8bitDetails(precision=options.precision, swapped=swapped, kept=kept, device=device)
    if not swapped:
        return PassOutcome(artifact, False, notes + ["no Linear layer was quantized: this artifact computes in float"],
                           details)
    result = artifact.derive("torch", obj=model)
    return PassOutcome(result, True, notes, details)


PASS = Pass(
    name="quantize_linear_8bit",
    consumes="torch",
    produces="torch",
    run=run,
    options=QuantizeLinear8bitOptions,
    details=Linear8bitDetails,
    description="FP8 (torch._scaled_mm) or INT8 W8A8 (torch._int_mm) Linear layers for stock PyTorch, before capture",
    needs_python_module="the 8-bit Linear layers replace the module's own, and TorchScript, .pt2 and ONNX have none; "
                        "the onnxruntime and tensorrt backends quantize the graph instead",
)
