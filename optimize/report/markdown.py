"""The build report: tables a person reads, made from the manifest.

The same sections render as ``report.md`` and as rich tables in the terminal, so the two never
disagree.
"""

from __future__ import annotations

import infopt.passes  # noqa: F401 - registers the bundled passes, whose own sections the report shows
from infopt.core.manifest_schema import Manifest
from infopt.core.pass_api import PASSES
from infopt.core.section import Section
from infopt.core.section import format_bytes as size_text
from infopt.core.section import format_number as num
from infopt.report.performance import cost_section, curve_section, roofline_section, tuning_section


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
        rows.append([p.name, f"{p.consumes} -> {p.produces}", f"{p.seconds:.2f}", size_text(p.size_bytes),
                     status, "; ".join(p.notes)])
    return Section("Passes", ["pass", "representation", "seconds", "size", "result", "notes"], rows)


def drift_section(manifest: Manifest) -> Section | None:
    drift = manifest.validation.drift
    if not drift:  # a text-generation build is judged by generating (generation_section)
        return None
    rows = [[name, num(o["max_abs"]), num(o["mean_abs"]), num(o["max_rel"]), num(o["cosine_min"], ".6f"),
             num(o["cosine_mean"], ".6f"), num(o["sqnr_db"], ".1f"), num(o["top1"])] for name, o in drift["outputs"].items()]
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


def _figure(value, fmt: str) -> str:
    """A figure formatted, or as the manifest holds a non-finite one ("nan", "inf")."""
    return format(value, fmt) if isinstance(value, (int, float)) else str(value)


def top1_text(forced: dict) -> str:
    """Teacher-forced top-1 agreement with its 95 % interval (builds before the interval was recorded: without)."""
    interval = " (95 %: {:.4f}-{:.4f})".format(*forced["top1_interval"]) if "top1_interval" in forced else ""
    return f"{_figure(forced['top1'], '.4f')}{interval} over {forced['tokens']} tokens"


def ppl_text(forced: dict) -> str:
    """The perplexity change with its 95 % interval (builds before the interval was recorded: without)."""
    interval = forced.get("ppl_delta_interval")
    finite = interval and all(isinstance(v, (int, float)) for v in interval) and interval[1] != float("inf")
    around = " (95 %: {:+.2%} to {:+.2%})".format(*interval) if finite else ""
    return f"{_figure(forced['ppl_delta'], '+.2%')}{around}"


def generation_section(manifest: Manifest) -> Section | None:
    """A text-generation build: the greedy check, TTFT per prompt length and TPOT per batch size."""
    gen = (manifest.validation.model_extra or {}).get("generation")
    if not gen:
        return None
    greedy, forced, quantized = gen["greedy"], gen.get("teacher_forced"), gen.get("quantization")
    reference = {"float32": "FP32", "bfloat16": "BF16"}.get(gen.get("reference_dtype", "float32"), "FP32")
    rows = [["greedy tokens equal to transformers' generate" + (f" ({reference})" if quantized else ""),
             f"{greedy['equal']} of {greedy['prompts']} prompts, {greedy['new_tokens']} tokens each"]]
    if forced:
        rows += [[f"top-1 agreement with {reference}, teacher-forced",
                  top1_text(forced)],
                 [f"perplexity ({reference})", f"{_figure(forced['ppl'], '.4g')} ({forced['ppl_reference']:.4g}): "
                                               f"{ppl_text(forced)}"]]
    if quantized:
        rows.append(["quantization", f"{quantized['precision'].upper()} {quantized['method']}, {quantized['layers']} "
                                     f"layers: {quantized['format']}"])
    rows += [[f"TTFT, {r['prompt_tokens']}-token prompt (batch 1)", f"p50 {r['p50_ms']:.2f} ms, p99 {r['p99_ms']:.2f} ms"]
             for r in gen["ttft"]]
    rows += [[f"TPOT, batch {r['batch']}", f"p50 {r['p50_ms']:.2f} ms, p99 {r['p99_ms']:.2f} ms, "
              f"{r['tokens_per_s']:.1f} tokens/s" + (f", ${r['usd_per_million_tokens']:.4g} per million tokens"
                                                    if r.get("usd_per_million_tokens") else "")] for r in gen["tpot"]]
    rows += [["model file (weights as stored)", size_text(gen["weights_bytes"])],
             ["KV cache per token of one sequence", size_text(gen["kv_cache_bytes_per_token"])]]
    if gen.get("not_timed"):
        return Section("Text generation", ["", ""], rows, [f"not timed: {gen['not_timed']}"])
    notes = [f"timed with onnxruntime_genai from servers/onnxruntime-genai/: TTFT is the prompt's pass and the first "
             f"token picked; TPOT each of the next {gen['new_tokens'] - 1} tokens after a {gen['tpot_prompt_tokens']}-token "
             "prompt; "
             f"{_span(r['runs'] for r in gen['ttft'] + gen['tpot'])} timed runs per row "
             + ("after the judging's runs (no warm-up)" if gen.get("warmed_by_judging") else "after one warm-up")
             + (f" (within a budget of {gen['budget_s']:.1f} s: each row once, then more, the rows with the fewest "
                "first)" if "budget_s" in gen else "")]
    if gen.get("left_out"):
        rows_out = ", ".join(f"TTFT at {r['prompt_tokens']} tokens" if r["kind"] == "ttft" else f"TPOT at batch {r['batch']}"
                             for r in gen["left_out"])
        notes.append(f"not timed: {rows_out} (one run predicted at {_span(round(r['predicted_ms'] / 1e3, 1) for r in gen['left_out'])} s, "
                     "past what was left of the budget, a share of the build's time); `infopt validate OUTPUT` times every row")
    price = manifest.target.price_per_hour
    notes.append(f"cost per million output tokens at ${price:g}/hour, the machine kept busy at that batch" if price else
                 "no cost per million tokens: the target has no price (pass --price-per-hour)")
    return Section("Text generation", ["", ""], rows, notes)


def _span(counts) -> str:
    """``30`` when every count is 30, else ``15-44``."""
    values = sorted(set(counts))
    return str(values[0]) if len(values) == 1 else f"{values[0]}-{values[-1]}"


def pass_sections(manifest: Manifest) -> list[Section]:
    """The sections the passes give of their own records (``PassDetails.sections``, from their typed details), in
    pipeline order; of two with one title (INT4 by the module and by the graph pass), the one with more rows."""
    found: dict[str, Section] = {}
    for record in manifest.passes:
        step = PASSES.items.get(record.name)
        if step is None or step.details is None or record.skipped or not record.details:
            continue
        for section in step.details.of(record.details).sections():
            kept = found.get(section.title)
            if kept is None or len(section.rows) > len(kept.rows):
                found[section.title] = section
    return list(found.values())


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
        rows.append([c["recipe"], verdict, num(c["cosine_min"], ".6f"), num(c["max_abs"], ".3g"),
                     *[num(c["p50_ms"].get(str(b)), ".3f") for b in batches],
                     f"{c['speedup']:.2f}x" if c["speedup"] else "-", size_text(c["size_bytes"]), "yes" if c["chosen"] else ""])
        notes += [f"{c['recipe']} failed {r}" for r in c["failed_checks"]]
    if any(c["status"] == "built" for c in rows_in):
        runs_on = {c["runs_on"] for c in rows_in if c["status"] == "built"}
        notes.append(f"measured on {', '.join(sorted(runs_on))}; p50 in ms; speedup is the geometric mean over batch "
                     "sizes of eager's time / the candidate's, each the median of paired trials timed side by side")
        notes += [f"{c['recipe']}: {c['timing']}" for c in rows_in if c.get("timing", "timed in full") != "timed in full"]
        notes += [f"{c['recipe']}'s speedup lies within " + ", ".join(
                      f"{lo:.2f}-{hi:.2f}x at batch {b}" for b, (lo, hi, _) in c["speedup_range"].items())
                  + f" ({_span(round(100 * conf) for _, _, conf in c['speedup_range'].values())} % confidence)"
                  for c in rows_in if c["status"] == "built" and c.get("speedup_range")]
    headers = ["candidate", "verdict", "cosine (min)", "max_abs", *[f"p50 b{b}" for b in batches],
               "speedup", "size", "chosen"]
    return Section("Candidates", headers, rows, notes)


def files_section(manifest: Manifest) -> Section:
    rows = [[rel, size_text(info.bytes), info.sha256[:16]] for rel, info in manifest.files.items()]
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
             generation_section(manifest), *pass_sections(manifest),
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
