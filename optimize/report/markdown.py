"""The build report: tables a person reads, made from the manifest.

The same sections render as ``report.md`` and as rich tables in the terminal, so the two never
disagree.
"""

from __future__ import annotations

from typing import Any

from infopt.core.manifest_schema import Manifest
from infopt.passes.fx.quantize_int4 import Int4Details
from infopt.passes.onnx.quantize_int8 import Int8Details
from infopt.report.performance import cost_section, curve_section, roofline_section, tuning_section
from infopt.report.section import Section


def _num(value: Any, fmt: str = ".4g") -> str:
    if value is None:
        return "-"
    if isinstance(value, str):
        return value
    return format(value, fmt)


def _bytes(n: int | None) -> str:
    if n is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def summary(manifest: Manifest) -> Section:
    v = manifest.validation
    target = manifest.target
    asked = f" ({manifest.precision_asked} asked; see the notes)" if manifest.precision_asked else ""
    rows = [["verdict", "PASS" if v.verdict.passed else "FAIL"],
            ["target", f"{target.name} ({target.description})"],
            ["precision", manifest.precision + asked],
            ["backend", manifest.backend],
            ["recipe", manifest.recipe["name"]], ["source", f"{manifest.source.path} ({manifest.source.format})"],
            ["validated on", v.device]]
    notes = [f"failed: {r}" for r in v.verdict.reasons] + v.notes + v.timing_notes
    return Section(f"infopt build: {manifest.name}", ["", ""], rows, notes)


def io_section(manifest: Manifest) -> Section:
    rows = [["input", i.name, i.dtype, str(i.shape)] for i in manifest.inputs.inputs]
    rows += [["output", o.name, o.dtype, str(o.shape)] for o in manifest.outputs]
    notes = [f"{k}: min {d.min}, opt {d.opt}, max {d.max}" for k, d in manifest.inputs.dims.items()]
    return Section("Inputs and outputs", ["", "name", "dtype", "shape"], rows, notes)


def passes_section(manifest: Manifest) -> Section:
    rows = []
    for p in manifest.passes:
        status = "skipped" if p.skipped else ("changed" if p.changed else "no change")
        rows.append([p.name, f"{p.consumes} -> {p.produces}", f"{p.seconds:.2f}", _bytes(p.size_bytes),
                     status, "; ".join(p.notes)])
    return Section("Passes", ["pass", "representation", "seconds", "size", "result", "notes"], rows)


def drift_section(manifest: Manifest) -> Section | None:
    drift = manifest.validation.drift
    if not drift:  # a text-generation build is judged by generating (generation_section)
        return None
    rows = [[name, _num(o["max_abs"]), _num(o["mean_abs"]), _num(o["max_rel"]), _num(o["cosine_min"], ".6f"),
             _num(o["cosine_mean"], ".6f"), _num(o["sqnr_db"], ".1f"), _num(o["top1"])] for name, o in drift["outputs"].items()]
    notes = [f"{drift['samples']} samples from {drift['source']}"]
    if drift["random_inputs"]:
        notes.append("WARNING: no --val data was given; drift was measured on random inputs, which may not "
                     "exercise the model as real data does. Pass --val PATH for a real figure.")
    return Section("Drift against the eager reference", ["output", "max_abs", "mean_abs", "max_rel", "cosine (min)",
                                                          "cosine (mean)", "SQNR dB", "top-1 agree"], rows, notes)


def latency_section(manifest: Manifest) -> Section | None:
    latency = manifest.validation.latency
    if not latency:
        return None
    base = {r.batch: r for r in latency if r.runner == "eager"}
    rows = []
    for r in latency:
        ref = base.get(r.batch)
        if r.runner == "eager":
            ratio = "1.00x"
        else:
            ratio = f"{ref.p50_ms / r.p50_ms:.2f}x" if ref and r.p50_ms > 0 else "-"
        rows.append([str(r.batch), r.runner, f"{r.p50_ms:.3f}", f"{r.p90_ms:.3f}", f"{r.p99_ms:.3f}",
                     f"{r.mean_ms:.3f}", f"{r.throughput:.1f}", ratio])
    notes = [f"{_span(r.iterations for r in latency)} timed runs per row after warm-up, in "
             f"{_span(r.blocks for r in latency)} blocks per runner, the runners taking turns (fewer where the median was "
             "pinned early or the runs are slow); p50 is the median of the block medians, samples/s is batch / p50, and "
             "speedup is eager p50 / candidate p50"] if latency else []
    return Section("Latency (ms)", ["batch", "runner", "p50", "p90", "p99", "mean", "samples/s", "speedup"], rows, notes)


def generation_section(manifest: Manifest) -> Section | None:
    """A text-generation build: the greedy check, TTFT per prompt length and TPOT per batch size."""
    gen = (manifest.validation.model_extra or {}).get("generation")
    if not gen:
        return None
    greedy, forced, quantized = gen["greedy"], gen.get("teacher_forced"), gen.get("quantization")
    rows = [["greedy tokens equal to transformers' generate" + (" (FP32)" if quantized else ""),
             f"{greedy['equal']} of {greedy['prompts']} prompts, {greedy['new_tokens']} tokens each"]]
    if forced:
        rows += [["top-1 agreement with FP32, teacher-forced", f"{forced['top1']:.4f} over {forced['tokens']} tokens"],
                 ["perplexity (FP32)", f"{forced['ppl']:.4g} ({forced['ppl_reference']:.4g}): "
                                       f"{forced['ppl_delta']:+.2%}"]]
    if quantized:
        rows.append(["quantization", f"{quantized['precision'].upper()} {quantized['method']}, {quantized['layers']} "
                                     f"layers: {quantized['format']}"])
    rows += [[f"TTFT, {r['prompt_tokens']}-token prompt (batch 1)", f"p50 {r['p50_ms']:.2f} ms, p99 {r['p99_ms']:.2f} ms"]
             for r in gen["ttft"]]
    rows += [[f"TPOT, batch {r['batch']}", f"p50 {r['p50_ms']:.2f} ms, p99 {r['p99_ms']:.2f} ms, "
              f"{r['tokens_per_s']:.1f} tokens/s" + (f", ${r['usd_per_million_tokens']:.4g} per million tokens"
                                                    if r.get("usd_per_million_tokens") else "")] for r in gen["tpot"]]
    rows += [["model file (weights as stored)", _bytes(gen["weights_bytes"])],
             ["KV cache per token of one sequence", _bytes(gen["kv_cache_bytes_per_token"])]]
    notes = [f"timed with onnxruntime_genai from servers/onnxruntime-genai/: TTFT is the prompt's pass and the first "
             f"token picked; TPOT each of the next {gen['new_tokens'] - 1} tokens after a {gen['tpot_prompt_tokens']}-token "
             "prompt; "
             f"{_span(r['runs'] for r in gen['ttft'] + gen['tpot'])} timed runs per row after one warm-up"]
    price = manifest.target.price_per_hour
    notes.append(f"cost per million output tokens at ${price:g}/hour, the machine kept busy at that batch" if price else
                 "no cost per million tokens: the target has no price (pass --price-per-hour)")
    return Section("Text generation", ["", ""], rows, notes)


def _span(counts) -> str:
    """``30`` when every count is 30, else ``15-44``."""
    values = sorted(set(counts))
    return str(values[0]) if len(values) == 1 else f"{values[0]}-{values[-1]}"


def _details(manifest: Manifest, kind, *names: str, with_layers: bool = False):
    """The typed details of the first pass among ``names`` that recorded any (and layers, if asked), or None."""
    for record in manifest.passes:
        details = kind.of(record.details) if record.name in names and not record.skipped else None
        if details is not None and (details.layers or not with_layers):
            return details
    return None


def int8_section(manifest: Manifest) -> Section | None:
    """The per-layer INT8 table: each layer's drift when it alone is INT8, and what stayed FP32."""
    d = _details(manifest, Int8Details, "quantize_int8", with_layers=True)
    if d is None:
        return None
    metric = d.budget_metric
    by_cost = d.fallback_order == "drift_per_ms"
    rows = [[str(i + 1), r["layer"], r["op"], r["module"] or "-", _num(r[metric], ".6g"), _num(r["sqnr_db"], ".1f"),
             *([_num(r.get("ms_saved"), ".3f")] if by_cost else []), r["precision"]] for i, r in enumerate(d.layers)]
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
                f", measured {_num(d.measured.get(metric), '.6g')} with the layers above in their final precision")
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


def int8_variants_section(manifest: Manifest) -> Section | None:
    """The INT8 graphs tried and timed against FP32, and which one shipped."""
    d = _details(manifest, Int8Details, "quantize_int8")
    if d is None or not d.variants:
        return None
    rows = []
    for v in d.variants:
        times = "; ".join(f"b{r['batch']} {r['ratio']:.2f} ({r['lower']:.2f}-{r['upper']:.2f})" for r in v["ratios"]) or "-"
        metric = v["drift"].get(d.budget_metric) if v["drift"] else None
        held = "error: " + v["error"] if v["error"] else ("yes" if v["holds_budget"] else "no")
        rows.append([v["name"], str(v["int8_layers"]), _num(metric, ".6g"), held, times])
    chosen = "FP32" if d.shipped == "fp32" else d.shipped_variant
    notes = ["time is the variant's / FP32's, median of ABBA trials with the confidence bounds, per batch size",
             f"shipped: {chosen}; {d.selection}"]
    return Section("INT8 variants", ["variant", "INT8 layers", d.budget_metric or "drift", "holds budget",
                                     "time vs FP32 per batch (bounds)"], rows, notes)


def int4_section(manifest: Manifest) -> Section | None:
    """The per-layer INT4 table: each Linear's group size and error, and why any stayed in float."""
    d = (_details(manifest, Int4Details, "quantize_int4", "quantize_int4_graph", with_layers=True)
         or _details(manifest, Int4Details, "quantize_int4", "quantize_int4_graph"))
    if d is None:
        return None
    rows = [[r["name"], "x".join(map(str, r["shape"])), "int4", str(r.get("group_size") or d.group_size),
             _num(r["error"], ".3g"), ""] for r in d.layers]
    rows += [[name, "-", "float", "-", "-", why] for name, why in d.kept.items()]
    notes = [f"{d.method.upper()}, group size {d.group_size} asked, "
             f"{'symmetric' if d.symmetric else 'asymmetric'}; {len(d.layers)}/{len(rows)} Linear layers INT4"]
    return Section("INT4 layers", ["layer", "out x in", "precision", "group size", "relative error", "why float"], rows, notes)


def candidates_section(manifest: Manifest) -> Section | None:
    """Every candidate the build considered: what it measured, whether it passed, which was chosen."""
    rows_in = manifest.candidates
    if len(rows_in) < 2:
        return None
    batches = sorted({int(b) for c in rows_in for b in c.get("p50_ms", {})})
    rows, notes = [], [f"chosen: {manifest.selection or ''}"]
    for c in rows_in:
        if c["status"] != "built":
            rows.append([c["recipe"], c["status"], "-", "-", *["-"] * len(batches), "-", "-", ""])
            notes.append(f"{c['recipe']} {c['status']}: {c['reason']}")
            continue
        verdict = "pass" if c["passed"] else "FAIL"
        rows.append([c["recipe"], verdict, _num(c["cosine_min"], ".6f"), _num(c["max_abs"], ".3g"),
                     *[_num(c["p50_ms"].get(str(b)), ".3f") for b in batches],
                     f"{c['speedup']:.2f}x" if c["speedup"] else "-", _bytes(c["size_bytes"]), "yes" if c["chosen"] else ""])
        notes += [f"{c['recipe']} failed {r}" for r in c["failed_checks"]]
    if any(c["status"] == "built" for c in rows_in):
        runs_on = {c["runs_on"] for c in rows_in if c["status"] == "built"}
        notes.append(f"measured on {', '.join(sorted(runs_on))}; p50 in ms; speedup is the geometric mean over batch "
                     "sizes of eager p50 / candidate p50")
    headers = ["candidate", "verdict", "cosine (min)", "max_abs", *[f"p50 b{b}" for b in batches],
               "speedup", "size", "chosen"]
    return Section("Candidates", headers, rows, notes)


def files_section(manifest: Manifest) -> Section:
    rows = [[rel, _bytes(info.bytes), info.sha256[:16]] for rel, info in manifest.files.items()]
    return Section("Files", ["path", "size", "sha256 (first 16)"], rows,
                   ["the reports and manifest.json are not listed here; the manifest holds the reports' sha256 too"])


def versions_section(manifest: Manifest) -> Section:
    return Section("Versions", ["tool", "version"], [[k, str(v)] for k, v in manifest.versions.items()])


def timings_section(manifest: Manifest) -> Section | None:
    """Where the build's time went, step by step in the order they ran."""
    t = manifest.timings
    if t is None:
        return None
    rows = [[s.step, s.of or "", f"{s.seconds:.2f}", f"{100 * s.seconds / t.total_s:.0f}%" if t.total_s else ""] for s in t.steps]
    return Section("Build time", ["step", "candidate", "seconds", "share"], rows,
                   [f"{t.total_s:.1f} s in all, from the call to the manifest; a pass that candidates share ran once, "
                    "for the first"])


def provenance_section(manifest: Manifest) -> Section | None:
    prov = manifest.provenance
    if not prov:
        return None
    rows = [["command", prov.command or prov.python_call or ""], ["recipe", prov.recipe]]
    for label, data in (("calibration", prov.calibration), ("validation data", prov.validation_data)):
        if data:
            rows.append([label, f"{data.samples} samples from {data.source}, sha256 {data.sha256[:16]}"])
    source = manifest.source
    if source.hub:
        rows.append(["Hugging Face", f"{source.hub.repo_id}@{source.hub.revision}, commit {source.hub.commit}"])
    if source.sha256:
        rows.append(["source", f"{source.path}, sha256 {source.sha256[:16]}"])
    return Section("Provenance", ["", ""], rows, ["`infopt verify DIST` re-hashes every file against this manifest"])


def sections(manifest: Manifest) -> list[Section]:
    found = [summary(manifest), candidates_section(manifest), io_section(manifest), passes_section(manifest),
             generation_section(manifest), int8_section(manifest), int8_variants_section(manifest), int4_section(manifest),
             drift_section(manifest), latency_section(manifest), curve_section(manifest), roofline_section(manifest),
             cost_section(manifest), tuning_section(manifest), timings_section(manifest), provenance_section(manifest),
             files_section(manifest),
             versions_section(manifest)]
    return [s for s in found if s is not None]


def to_markdown(manifest: Manifest) -> str:
    out = []
    for i, section in enumerate(sections(manifest)):
        out.append(("# " if i == 0 else "## ") + section.title + "\n")
        if section.rows:
            headers = section.headers if any(section.headers) else ["item", "value"]
            out.append("| " + " | ".join(headers) + " |")
            out.append("|" + "|".join(" --- " for _ in headers) + "|")
            for row in section.rows:
                out.append("| " + " | ".join(c.replace("|", "\\|") for c in row) + " |")
            out.append("")
        for note in section.notes:
            out.append(f"- {note}")
        if section.notes:
            out.append("")
    return "\n".join(out)


def print_sections(console, chosen: list[Section]) -> None:
    from rich.table import Table

    for section in chosen:
        table = Table(title=section.title, title_justify="left", show_header=any(section.headers))
        for i, header in enumerate(section.headers or ["", ""]):
            table.add_column(header, no_wrap=i == 0)  # the row's name stays whole; the figures wrap
        for row in section.rows:
            table.add_row(*row)
        console.print(table)
        for note in section.notes:
            style = "bold red" if note.startswith(("failed", "WARNING")) else "dim"
            console.print(f"  {note}", style=style, markup=False)
