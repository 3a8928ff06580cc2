"""What a build says about its chosen artifact's lineage: the TensorRT engine the server builds,
INT8's mode, choice and budget, and a noisy machine's timings. Notes for the manifest and report."""

from __future__ import annotations

from infopt.passes.lower.tensorrt_build import TensorRTDetails
from infopt.passes.onnx.quantize_int8 import Int8Details


def server_engine(lineage) -> TensorRTDetails | None:
    """What ``tensorrt_build`` recorded when it left the engine to the server, or None."""
    for record in lineage:
        details = TensorRTDetails.of(record.details) if record.name == "tensorrt_build" and not record.skipped else None
        if details is not None and details.engine == "server":
            return details
    return None


def triton_engine(server: TensorRTDetails | None) -> dict | None:
    """The Triton config's request for that engine: precision mode and workspace."""
    if server is None:
        return None
    return {"precision_mode": server.precision_mode, "workspace_bytes": int(server.workspace_gb * 2**30)}


def engine_notes(server: TensorRTDetails | None) -> list[str]:
    if server is None:
        return []
    return [f"the TensorRT engine is built on the server at load time ({server.reason} here): Triton's ONNX Runtime "
            f"backend with the TensorRT execution accelerator, precision {server.precision_mode}; what was validated "
            "here is the ONNX model it is built from"]


def int8_details(lineage) -> list[Int8Details]:
    """What each INT8 pass that ran recorded."""
    found = (Int8Details.of(r.details) for r in lineage if r.name == "quantize_int8" and not r.skipped)
    return [d for d in found if d is not None]


def shipped_fp32(lineage) -> bool:
    """Whether the INT8 pass shipped FP32: it was faster here, or no layer of the model is one INT8 covers."""
    return any(d.shipped == "fp32" for d in int8_details(lineage))


def noise_notes(timings) -> list[str]:
    """A warning when the blocks of a timing disagree: the machine was busy while it was measured."""
    noisy = sorted((t for t in timings if t.noisy), key=lambda t: -t.spread)
    if not noisy:
        return []
    worst = noisy[0]
    more = f" (and {len(noisy) - 1} more of the latency rows)" if len(noisy) > 1 else ""
    return [f"WARNING: the machine was noisy while timing: {worst.runner}'s {worst.blocks} block medians at batch "
            f"{worst.batch} lie {100 * worst.spread:.0f}% of its p50 apart{more}; the p50s and speedups are less "
            "certain. Time again on an idle machine, or compare two builds with `infopt gate`, which bounds the ratio"]


def int8_notes(lineage) -> list[str]:
    """What the report and CLI say about INT8: dynamic without calibration and why; a missed budget."""
    notes = []
    for d in int8_details(lineage):
        if not d.layers:
            notes.append(f"no layer was quantized ({d.mode} INT8 found no layer it covers): this artifact "
                         "computes in FP32" + ("; pass --calib PATH for static INT8, which covers Conv and Gemm"
                                               if d.mode == "dynamic" else ""))
            continue
        if d.shipped == "fp32":
            notes.append(f"{d.selection}: this artifact computes in FP32")
            continue
        if d.mode == "dynamic":
            notes.append("INT8 is dynamic: no calibration data was given, so activations are quantized per batch "
                         "at run time and only MatMul layers are INT8; pass --calib PATH for static INT8")
        if d.selection:
            notes.append(f"INT8 graph chosen by measurement: {d.selection}")
        if d.budget_met is False:
            notes.append(f"the drift budget {d.budget} was not met on {d.measured_on} "
                         f"({len(d.excluded)}/{len(d.layers)} layers in FP32)")
    return notes
