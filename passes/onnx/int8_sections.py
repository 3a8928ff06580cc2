"""What the INT8 pass shows of itself: its report sections (``Int8Details.sections``: the per-layer table and the
variants tried), its notes (``Int8Details.notes``) and the precision it shipped (``Int8Details.shipped_precision``).

Each is given the pass's typed details (``Int8Details``) of one record; the report and the builder place and
render them, and name no pass."""

from __future__ import annotations

from infopt.core.section import Section
from infopt.core.section import format_number as num


def int8_sections(d) -> list[Section]:
    """The ``Int8Details`` of one ``quantize_int8`` record as the report's sections."""
    return [s for s in (layers_section(d), variants_section(d)) if s is not None]


def layers_section(d) -> Section | None:
    """The per-layer INT8 table: each layer's drift when it alone is INT8, and what stayed FP32 (none when the pass
    measured no drift)."""
    if not d.layers or d.budget_metric is None:
        return None
    metric = d.budget_metric
    by_cost = d.fallback_order == "drift_per_ms"
    rows = [[str(i + 1), r["layer"], r["op"], r["module"] or "-", num(r[metric], ".6g"), num(r["sqnr_db"], ".1f"),
             *([num(r.get("ms_saved"), ".3f")] if by_cost else []), r["precision"]] for i, r in enumerate(d.layers)]
    quantized = sum(r["precision"] == "int8" for r in d.layers)
    if by_cost:
        order = (f"rows in the order the fallback moves layers to FP32: layers whose INT8 form saves no time first, "
                 f"then the most drift per millisecond saved (drift alone on {d.measured_on}; ms saved per run from "
                 f"ONNX Runtime's profiler, FP32 against every layer in INT8)")
    elif d.ranked:
        order = f"rows are ranked by the drift each layer adds when it alone is INT8 (on {d.measured_on})"
    else:
        order = ("rows in graph order; each layer's drift alone was not measured, "
                 "since the model with every layer in INT8 met the budget")
    measured = (" by the FP32 model shipped (no INT8 layer: see INT8 variants)" if d.shipped == "fp32" else
                f", measured {num(d.measured.get(metric), '.6g')} with the layers above in their final precision")
    notes = [f"{d.mode} INT8, {d.placement} placement: {quantized}/{len(d.layers)} layers INT8; {order}",
             f"budget {d.budget}: {'met' if d.budget_met else 'NOT met'}{measured}"]
    if d.excluded:
        notes.append("kept in FP32 by the fallback, in order: " + ", ".join(d.excluded))
    calib = d.calibration
    if calib:
        notes.append(f"calibration: {calib['method']} on {calib['samples']} samples from {calib['source']}"
                     + (" (read from the calibration cache)" if calib["cached"] else ""))
    columns = ["rank", "layer", "op", "module", f"{metric} alone", "SQNR dB", *(["ms saved"] if by_cost else []), "precision"]
    return Section("INT8 layers", columns, rows, notes)


def variants_section(d) -> Section | None:
    """The INT8 graphs tried and timed against FP32, and which one shipped."""
    if not d.variants:
        return None
    rows = []
    for v in d.variants:
        times = "; ".join(f"b{r['batch']} {r['ratio']:.2f} ({r['lower']:.2f}-{r['upper']:.2f})" for r in v["ratios"]) or "-"
        metric = v["drift"].get(d.budget_metric) if v["drift"] else None
        held = "error: " + v["error"] if v["error"] else ("yes" if v["holds_budget"] else "no")
        rows.append([v["name"], str(v["int8_layers"]), num(metric, ".6g"), held, times])
    chosen = "FP32" if d.shipped == "fp32" else d.shipped_variant
    notes = ["time is the variant's / FP32's, median of ABBA trials with the confidence bounds, per batch size",
             f"shipped: {chosen}; {d.selection}"]
    return Section("INT8 variants", ["variant", "INT8 layers", d.budget_metric or "drift", "holds budget",
                                     "time vs FP32 per batch (bounds)"], rows, notes)


def int8_notes(d) -> list[str]:
    """What the report and CLI say about INT8: dynamic without calibration and why; a missed budget."""
    if not d.layers:
        return [f"no layer was quantized ({d.mode} INT8 found no layer it covers): this artifact computes in FP32"
                + ("; pass --calib PATH for static INT8, which covers Conv and Gemm" if d.mode == "dynamic" else "")]
    if d.shipped == "fp32":
        return [f"{d.selection}: this artifact computes in FP32"]
    if d.budget is None:
        return [f"INT8 is dynamic: {len(d.layers)} layers, activations quantized per call; the pass measured no drift"]
    notes = []
    if d.mode == "dynamic":
        notes.append("INT8 is dynamic: no calibration data was given, so activations are quantized per batch "
                     "at run time and only MatMul layers are INT8; pass --calib PATH for static INT8")
    if d.selection:
        notes.append(f"INT8 graph chosen by measurement: {d.selection}")
    if d.budget_met is False:
        notes.append(f"the drift budget {d.budget} was not met on {d.measured_on} "
                     f"({len(d.excluded)}/{len(d.layers)} layers in FP32)")
    return notes


def int8_shipped_precision(d) -> str | None:
    """fp32 when the pass shipped FP32: it was faster here, or no layer of the model is one INT8 covers."""
    return "fp32" if d.shipped == "fp32" else None
