"""The report's performance sections: latency by batch size, the roofline, cost per million and the
Triton serving config the build tuned, each made from the manifest's measured figures."""

from __future__ import annotations

from infopt.core.manifest_schema import Manifest
from infopt.core.section import Section
from infopt.exporters.servers.triton_tuning import Tuning
from infopt.validators.roofline import cost_notes, cost_per_million, measured_curve, roofline


def _fmt(value: float | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def curve_section(manifest: Manifest) -> Section | None:
    """The shipped model's latency at each batch size (the data behind the latency plot)."""
    curve = measured_curve(manifest)
    if not curve:
        return None
    rows = [[str(p["batch"]), f"{p['p50_ms']:.3f}", f"{p['p90_ms']:.3f}", f"{p['p99_ms']:.3f}", f"{p['mean_ms']:.3f}",
             f"{p['throughput']:.1f}", f"{p['p50_ms'] / p['batch']:.4f}"] for p in curve]
    notes = [f"measured on {manifest.validation.device or 'an unrecorded device'}, "
             f"{curve[0].get('iterations', '?')} timed runs per batch size after warm-up; samples/s = batch / p50 latency"]
    return Section("Latency by batch size (ms)", ["batch", "p50", "p90", "p99", "mean", "samples/s", "p50 per sample"],
                   rows, notes)


def roofline_section(manifest: Manifest) -> Section | None:
    """Achieved TFLOP/s, intensity, the target's roof and the fraction of it, per batch size."""
    line = roofline(manifest)
    if line is None:
        return None
    rows = [[str(p["batch"]), f"{p['throughput']:.1f}", _fmt(p["achieved_tflops"], ".4g"), _fmt(p["intensity"], ".4g"),
             _fmt(p["roof_tflops"], ".4g"), _fmt(None if p["fraction_of_roof"] is None else 100 * p["fraction_of_roof"], ".3g"),
             p["bound"] or "-"] for p in line["points"]]
    head = []
    if line["flops_per_sample"] is not None:
        head.append(f"{line['flops_per_sample']:.4g} FLOPs per sample, {line['weight_bytes']} weight bytes, "
                    f"{line['io_bytes_per_sample']} io bytes per sample")
    if line["ridge_intensity"] is not None:
        head.append(f"roof: {line['roof_dtype']} peak {line['peak_tflops']:g} TFLOP/s, bandwidth "
                    f"{line['memory_bandwidth_gbs']:g} GB/s, ridge at {line['ridge_intensity']:.4g} FLOP/byte")
    return Section("Roofline", ["batch", "samples/s", "achieved TFLOP/s", "FLOP/byte", "roof TFLOP/s", "% of roof", "bound"],
                   rows, head + line["notes"])


def cost_section(manifest: Manifest) -> Section | None:
    """USD per million predictions per batch size; a section with only a note when there is no price."""
    if not measured_curve(manifest):
        return None
    rows = [[str(c["batch"]), f"{c['throughput']:.1f}", _fmt(c["usd_per_million"], ".4g")]
            for c in cost_per_million(manifest)]
    return Section("Cost per million predictions", ["batch", "samples/s", "USD per 1M"], rows, cost_notes(manifest))


def tuning_section(manifest: Manifest) -> Section | None:
    """The curve the tuning read and the reasons for each setting; None when the build made no tuning."""
    if not manifest.triton_tuning:
        return None
    tuning = Tuning.from_json(manifest.triton_tuning)
    validation = manifest.validation
    points = sorted(validation.curve, key=lambda p: p["batch"])
    base = points[0] if points else None
    rows = []
    for p in points:
        relative = f"{p['throughput'] / base['throughput']:.2f}x" if base and base["throughput"] > 0 else "-"
        rows.append([str(p["batch"]), f"{p['p50_ms']:.3f}", f"{p['p99_ms']:.3f}", f"{p['throughput']:.1f}", relative,
                     "yes" if p["batch"] in tuning.preferred_batch_sizes else ""])
    if tuning.dynamic_batching:
        batching = (f"dynamic batching, preferred {tuning.preferred_batch_sizes or 'none'}, "
                    f"max_queue_delay {tuning.max_queue_delay_us} us")
    else:
        batching = "no dynamic batching"
    notes = [f"config.pbtxt: {tuning.instance_count} x {tuning.instance_kind}, {batching}, "
             f"warm-up at batch {', '.join(str(w['batch_size']) for w in tuning.warmup)}"]
    if points:
        notes.append(f"measured on {validation.device}, {points[0]['iterations']} timed "
                     f"runs per batch; p50/p99 in ms; relative is throughput / batch {base['batch']}'s")
    notes += tuning.reasons
    headers = ["batch", "p50", "p99", "samples/s", f"vs batch {base['batch']}" if base else "relative", "preferred"]
    return Section("Triton serving config", headers, rows, notes)
