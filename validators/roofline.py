"""Work per prediction, the roofline line and cost per million predictions, from the manifest.

Three figures a person asks of a shipped model besides its latency:

- how much work one prediction is (FLOPs, bytes in and out, weight bytes), counted once on the
  eager module with ``torch.utils.flop_counter.FlopCounterMode``;
- how close the measured throughput comes to what the target could do at that work
  (the roofline: ``roof = min(peak, intensity x bandwidth)``, Williams, Waterman and Patterson,
  "Roofline", CACM 2009);
- what a million predictions cost at the target's declared price per hour.

Throughput is what was measured on ``validation.device``; peak, bandwidth and price are the
target's declared figures (``recipes/targets.yaml``). When those are different machines the
fraction of roof and the cost describe the measuring machine's speed at the target's price and
roof, and the notes say so. Missing figures give ``None`` and a note, never an invented number.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from infopt.core.manifest_schema import Manifest

ROOF_DTYPE = {"fp32": "fp32", "fp16": "fp16", "bf16": "bf16", "int8": "int8", "int4": "fp16", "fp8": "fp8"}
"""The peak a precision computes at: INT4 is weight-only (W4A16), its matmuls run in fp16."""

TRAFFIC_MODEL = ("bytes moved per batch = weight bytes + batch x (input + output bytes per sample): a lower "
                 "bound that assumes the weights are read once per batch and activations stay on chip")


def _batch_of(feed: dict[str, np.ndarray], input_names: Sequence[str]) -> int:
    first = np.asarray(feed[input_names[0]])
    return int(first.shape[0]) if first.ndim else 1


def count_work(module: Any, feed: dict[str, np.ndarray], input_names: Sequence[str], weight_bytes: int, *,
               batch: int | None = None, outputs: Sequence[np.ndarray] | None = None,
               weight_source: str = "model file size") -> dict[str, Any]:
    """FLOPs and bytes per sample of one prediction.

    ``module`` runs once on ``feed`` (tensors in ``input_names`` order) under ``FlopCounterMode``;
    its total is divided by ``batch`` (default: the first input's leading dim). FlopCounterMode
    counts matmul, convolution and attention at 2 FLOPs per multiply-add; elementwise ops,
    normalization and pooling are not counted, so the figure is a slight undercount. ``module`` may
    be None (an ONNX source has no eager module): then ``flops_per_sample`` is None and
    ``outputs`` (the model's outputs for ``feed``, if the caller has them) give the output bytes.

    Returns ``{"flops_per_sample", "weight_bytes", "io_bytes_per_sample", "method"}``.
    """
    names = list(input_names)
    n = batch if batch is not None else _batch_of(feed, names)
    n = max(int(n), 1)
    flops: float | None = None
    why = ""
    if module is None:
        why = "FLOPs not counted: there is no eager torch module (ONNX source)"
    else:
        import torch
        from torch.utils._pytree import tree_leaves
        from torch.utils.flop_counter import FlopCounterMode

        args = [torch.from_numpy(np.ascontiguousarray(feed[name])) for name in names]
        try:
            with torch.no_grad(), FlopCounterMode(display=False) as counter:
                result = module(*args)
        except Exception as exc:  # noqa: BLE001 - the user's forward; the report says why it has no FLOPs
            why = f"FLOPs not counted: the forward failed under FlopCounterMode ({type(exc).__name__}: {exc})"
        else:
            flops = counter.get_total_flops() / n
            outputs = [t.detach().cpu().numpy() for t in tree_leaves(result) if isinstance(t, torch.Tensor)]
            why = (f"FLOPs: torch FlopCounterMode on the eager module at batch {n}, divided by {n} "
                   "(matmul, conv and attention at 2 per multiply-add; elementwise ops not counted)")
    in_bytes = sum(np.asarray(feed[name]).nbytes for name in names)
    out_bytes = sum(np.asarray(o).nbytes for o in outputs) if outputs is not None else 0
    io_what = "inputs + outputs" if outputs is not None else "inputs only (outputs unknown)"
    method = f"{why}; io bytes: {io_what} per sample; weight bytes: {weight_source}"
    return {"flops_per_sample": flops, "weight_bytes": int(weight_bytes),
            "io_bytes_per_sample": int(round((in_bytes + out_bytes) / n)), "method": method}


def measured_curve(manifest: Manifest) -> list[dict[str, Any]]:
    return sorted((p for p in manifest.validation.curve if p.get("batch", 0) > 0), key=lambda p: p["batch"])


def _measured_kind(manifest: Manifest) -> str:
    device = manifest.validation.device
    return device.split(" ", 1)[0].lower() if device else "unknown"


def measured_caveat(manifest: Manifest, what: str) -> str | None:
    """A note when the throughput was measured on another kind of device than the target's."""
    target = manifest.target
    device = manifest.validation.device or "an unrecorded device"
    kind = _measured_kind(manifest)
    if kind != target.device:
        return (f"throughput was measured on {device}, not on target {target.name} ({target.device}); "
                f"{what} is not a statement about the target")
    if kind == "cuda":
        return (f"throughput was measured on {device}; {what} holds for target {target.name} only if that GPU "
                f"is a {target.description or target.name}")
    return None


def roofline(manifest: Manifest) -> dict[str, Any] | None:
    """Achieved TFLOP/s against the target's roof at each measured batch size; None without a curve.

    Per point, with F = FLOPs per sample, T = samples/s measured, b = batch, W = weight bytes and
    IO = input + output bytes per sample:

    - achieved TFLOP/s = F x T / 1e12
    - arithmetic intensity I = F x b / (W + b x IO) FLOP/byte (see ``TRAFFIC_MODEL``)
    - roof TFLOP/s = min(peak[precision], I x bandwidth GB/s / 1e3)
    - fraction = achieved / roof, and the point is memory-bound when I < peak / bandwidth (the ridge)
    """
    curve = measured_curve(manifest)
    if not curve:
        return None
    target = manifest.target
    work = manifest.validation.work or {}
    precision = manifest.precision
    dtype = ROOF_DTYPE.get(precision, precision)
    peak = target.peak_tflops.get(dtype)
    bandwidth = target.memory_bandwidth_gbs
    flops = work.get("flops_per_sample")
    weight = work.get("weight_bytes")
    io = work.get("io_bytes_per_sample")
    roof = f"'s, {target.measured}" if target.measured else "'s declared peak and bandwidth"
    notes = [f"throughput measured on {manifest.validation.device or 'an unrecorded device'}; "
             f"the roof is target {target.name}{roof}", TRAFFIC_MODEL]
    if work.get("method"):
        notes.append(work["method"])
    caveat = measured_caveat(manifest, "the fraction of roof")
    if caveat:
        notes.append(caveat)
    if not work:
        notes.append("no work figures in the manifest (validation.work): no FLOPs, intensity or roof")
    elif flops is None:
        notes.append("FLOPs per sample are unknown: no achieved TFLOP/s, intensity or roof")
    if bandwidth is None or peak is None:
        missing = [w for w, v in (("memory bandwidth", bandwidth), (f"{dtype} peak", peak)) if v is None]
        notes.append(f"target {target.name} declares no {' or '.join(missing)} (recipes/targets.yaml): "
                     "there is no roof to compare against")
    if precision != dtype:
        notes.append(f"{precision} is weight-only: its matmuls compute in {dtype}, so the roof is the {dtype} peak")
    ridge = peak * 1e3 / bandwidth if peak and bandwidth else None
    points = []
    for p in curve:
        batch, throughput = int(p["batch"]), float(p["throughput"])
        achieved = intensity = roof = fraction = None
        moved = weight + batch * io if weight is not None and io is not None else None
        if flops is not None:
            achieved = flops * throughput / 1e12
            intensity = flops * batch / moved if moved else None
        if intensity is not None and peak is not None and bandwidth is not None:
            roof = min(peak, intensity * bandwidth / 1e3)
            fraction = achieved / roof if roof > 0 else None
        bound = None if intensity is None or ridge is None else ("memory" if intensity < ridge else "compute")
        points.append({"batch": batch, "throughput": throughput, "bytes_per_batch": moved, "intensity": intensity,
                       "achieved_tflops": achieved, "roof_tflops": roof, "fraction_of_roof": fraction, "bound": bound})
    return {"target": target.name, "measured_on": manifest.validation.device, "precision": precision,
            "roof_dtype": dtype, "peak_tflops": peak, "memory_bandwidth_gbs": bandwidth, "ridge_intensity": ridge,
            "flops_per_sample": flops, "weight_bytes": weight, "io_bytes_per_sample": io,
            "has_roof": ridge is not None and flops is not None, "points": points, "notes": notes}


def cost_per_million(manifest: Manifest) -> list[dict[str, Any]]:
    """USD per million predictions at each measured batch size: price_per_hour / 3600 / T x 1e6,
    T the measured samples/s (batch / p50 latency, one batch at a time, the device kept busy).
    Empty when the target declares no price (``cost_notes`` says so)."""
    price = manifest.target.price_per_hour
    if price is None:
        return []
    return [{"batch": int(p["batch"]), "throughput": float(p["throughput"]),
             "usd_per_million": price / 3600 / float(p["throughput"]) * 1e6 if p["throughput"] > 0 else None}
            for p in measured_curve(manifest)]


def cost_notes(manifest: Manifest) -> list[str]:
    """What the cost figures assume, and why there are none when there are none."""
    target = manifest.target
    price = target.price_per_hour
    if price is None:
        return [f"target {target.name} declares no price_per_hour (recipes/targets.yaml): no cost figures; "
                "pass --price-per-hour USD for the machine you deploy on"]
    notes = [f"price {price:g} USD/hour is target {target.name}'s indicative figure; throughput is the measured "
             "samples/s = batch / p50 latency, one batch at a time with the device kept busy"]
    caveat = measured_caveat(manifest, "the cost")
    return notes + ([caveat] if caveat else [])
