"""The comparison of a sweep's cells: ``sweep.json``, ``sweep.md`` and a self-contained ``sweep.html``.

Per model, a row per cell (verdict, drift, p50/p99 and throughput at each measured batch size, size,
cost per million), the chosen cell per target (the fastest at the smallest measured batch among the
cells that passed validation: the budget is each cell's verdict; a GPU cell timed on a CPU because the
sweep ran where there is no GPU is not chosen), and the Pareto front of latency
against accuracy loss (1 - mean cosine to the eager model, or max_abs where a model has no cosine):
the cells no other cell beats on both. The HTML draws the front.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from infopt.core.section import Section
from infopt.report.html import CSS, Chart, Series, linear_axis, log_axis, section_html

BUILT = ("passed", "failed", "reused")


def _first(cell: dict[str, Any]) -> dict[str, Any] | None:
    latency = cell.get("summary", {}).get("latency") or []
    return min(latency, key=lambda r: r["batch"]) if latency else None


def on_target(cell: dict[str, Any]) -> bool:
    """Whether the cell was timed on its target's device (a GPU cell built where there is no GPU was not)."""
    return bool(cell.get("summary", {}).get("measured_on_target", True))


def loss(cell: dict[str, Any]) -> tuple[str, float] | None:
    """(what, value): the accuracy a cell gave up, lower is better."""
    summary = cell.get("summary", {})
    drift = summary.get("drift") or {}
    if summary.get("task") == "text-generation":
        return ("1 - top-1 agreement (teacher-forced)", max(0.0, 1.0 - float(drift["top1"]))) \
            if drift.get("top1") is not None else None
    if drift.get("cosine_mean") is not None:
        return "1 - cosine (mean)", max(0.0, 1.0 - float(drift["cosine_mean"]))
    if drift.get("max_abs") is not None:
        return "max_abs", float(drift["max_abs"])
    return None


def chosen(cells: list[dict[str, Any]]) -> dict[str, dict[str, str]]:
    """model -> target -> the label of its fastest cell that passed validation."""
    best: dict[str, dict[str, tuple[float, str]]] = {}
    for c in cells:
        first = _first(c)
        if c["status"] not in BUILT or not c.get("summary", {}).get("passed") or first is None or not on_target(c):
            continue
        label = f"{c['target']}-{c['precision']}-{c['backend']}"
        mine = best.setdefault(c["model"], {})
        if c["target"] not in mine or first["p50_ms"] < mine[c["target"]][0]:
            mine[c["target"]] = (first["p50_ms"], label)
    return {model: {t: label for t, (_, label) in targets.items()} for model, targets in best.items()}


def pareto(cells: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The built cells (of one model, timed on their targets) that no other beats on both latency and accuracy loss."""
    points = [(c, _first(c)["p50_ms"], loss(c)[1]) for c in cells
              if c["status"] in BUILT and _first(c) and loss(c) and on_target(c)]
    return [c for c, t, e in points if not any(t2 <= t and e2 <= e and (t2, e2) != (t, e) for _, t2, e2 in points)]


def _num(value: Any, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def model_section(model: str, cells: list[dict[str, Any]], picks: dict[str, str]) -> Section:
    front = {id(c) for c in pareto(cells)}
    rows, notes = [], []
    for c in cells:
        label = f"{c['target']}-{c['precision']}-{c['backend']}"
        s = c.get("summary", {})
        first = _first(c)
        lost = loss(c)
        marks = [m for m, on in (("chosen", picks.get(c["target"]) == label), ("front", id(c) in front)) if on]
        rows.append([label, c["status"], s.get("recipe") or "-", s.get("precision") or "-",
                     _num(lost[1], ".3g") if lost else "-",
                     f"b{first['batch']}: {first['p50_ms']:.3f} / {first['p99_ms']:.3f}" if first else "-",
                     _num(first["throughput"] if first else None, ".1f"),
                     f"{first['speedup']:.2f}x" if first and first.get("speedup") else "-",
                     _num(s.get("model_bytes") / 2**20 if s.get("model_bytes") else None, ".3g"),
                     _num(first.get("usd_per_million") if first else None, ".3g"), ", ".join(marks)])
        if c.get("error"):
            notes.append(f"{label} {c['status']}: {c['error']}")
    off = sorted({f"{c['target']} ({c['summary'].get('measured_on')})" for c in cells if c["status"] in BUILT and not on_target(c)})
    if off:
        notes.append(f"timed on this machine, not on the target: {', '.join(off)}; those cells' latency and cost are not "
                     "the target's, so they are neither chosen nor on the front (run them where the GPU is: --ray)")
    if any(c.get("summary", {}).get("task") == "text-generation" for c in cells):
        notes.append("text-generation cells: latency is TPOT (each output token after the first), samples/s is output "
                     "tokens/s, USD per 1M is per million output tokens; their accuracy loss is against the FP32 model")
    kinds = {loss(c)[0] for c in cells if loss(c)}
    notes.append(f"accuracy loss is {' or '.join(sorted(kinds)) or 'unmeasured'} against the eager model; latency is "
                 "p50 / p99 in ms at the smallest batch measured; speedup is eager p50 / the cell's; size in MiB; "
                 "chosen: the fastest cell per target that passed validation; front: no other cell is both faster and "
                 "more accurate")
    return Section(f"{model}", ["cell", "status", "recipe", "ships", "accuracy loss", "latency", "samples/s", "speedup",
                                "MiB", "USD per 1M", ""], rows, notes)


def sections(cells: list[dict[str, Any]]) -> list[Section]:
    picks = chosen(cells)
    models = list(dict.fromkeys(c["model"] for c in cells))
    counts = {s: sum(c["status"] == s for c in cells) for s in dict.fromkeys(c["status"] for c in cells)}
    rows = [["cells", str(len(cells))], *[[s, str(n)] for s, n in counts.items()]]
    for m in models:
        rows.append([f"chosen for {m}", ", ".join(f"{t}: {label}" for t, label in picks.get(m, {}).items()) or "none passed"])
    head = Section("infopt sweep", ["", ""], rows)
    return [head, *[model_section(m, [c for c in cells if c["model"] == m], picks.get(m, {})) for m in models]]


def to_markdown(cells: list[dict[str, Any]]) -> str:
    out = []
    for i, section in enumerate(sections(cells)):
        out.append(("# " if i == 0 else "## ") + section.title + "\n")
        out.append("| " + " | ".join(h or " " for h in section.headers) + " |")
        out.append("|" + "|".join(" --- " for _ in section.headers) + "|")
        out += ["| " + " | ".join(str(v).replace("|", "\\|") for v in row) + " |" for row in section.rows]
        out.append("")
        out += [f"- {n}" for n in section.notes]
        out.append("")
    return "\n".join(out)


def pareto_chart(model: str, cells: list[dict[str, Any]]) -> str | None:
    points = [(c, _first(c), loss(c)) for c in cells if c["status"] in BUILT and _first(c) and loss(c) and on_target(c)]
    if not points:
        return None
    front = {id(c) for c in pareto(cells)}
    latencies = [f["p50_ms"] for _, f, _ in points]
    losses = [max(lost[1], 1e-7) for _, _, lost in points]
    chart = Chart(f"pareto-{model}", f"{model}: latency against accuracy loss", "p50 latency (ms)",
                  f"{points[0][2][0]} (log)", linear_axis(latencies), log_axis(losses, 10))
    for name, css, keep in (("on the front", "s0", True), ("dominated", "s2", False)):
        marks = [(f["p50_ms"], max(lost[1], 1e-7), f["batch"],
                  f"{c['target']}-{c['precision']}-{c['backend']}: {f['p50_ms']:.3f} ms, loss {lost[1]:.3g}")
                 for c, f, lost in points if (id(c) in front) == keep]
        if marks:
            chart.series.append(Series(name, sorted(marks), css, line=keep))
    return chart.render()


def to_html(cells: list[dict[str, Any]]) -> str:
    body = []
    for i, section in enumerate(sections(cells)):
        body.append(section_html(section, "h1" if i == 0 else "h2"))
        if i and (chart := pareto_chart(section.title, [c for c in cells if c["model"] == section.title])):
            body.append(f"<figure>{chart}</figure>")
    return "\n".join(["<!DOCTYPE html>", '<html lang="en">', "<head>", '<meta charset="utf-8">',
                      "<title>infopt sweep</title>", f"<style>{CSS}</style>", "</head>", "<body>", "<main>", *body,
                      "</main>", "</body>", "</html>", ""])


def write_reports(root: Path, cells: list[dict[str, Any]]) -> None:
    root.mkdir(parents=True, exist_ok=True)
    picks = chosen(cells)
    data = {"cells": cells, "chosen": picks,
            "pareto": {m: [f"{c['target']}-{c['precision']}-{c['backend']}" for c in pareto([x for x in cells if x["model"] == m])]
                       for m in dict.fromkeys(c["model"] for c in cells)}}
    (root / "sweep.json").write_text(json.dumps(data, indent=2) + "\n")
    (root / "sweep.md").write_text(to_markdown(cells))
    (root / "sweep.html").write_text(to_html(cells))


def to_junit(cells: list[dict[str, Any]]) -> str:
    """One testcase per cell: a failure for one that did not pass, skipped for one its target cannot run."""
    import xml.etree.ElementTree as ET

    bad = [c for c in cells if c["status"] in ("failed", "error", "timeout")]
    skipped = [c for c in cells if c["status"] == "unsupported"]
    suite = ET.Element("testsuite", name="infopt sweep", tests=str(len(cells)), failures=str(len(bad)), errors="0",
                       skipped=str(len(skipped)))
    for c in cells:
        case = ET.SubElement(suite, "testcase", classname=f"infopt.sweep.{c['model']}",
                             name=f"{c['target']}-{c['precision']}-{c['backend']}", time=f"{c.get('seconds', 0):.1f}")
        if c["status"] == "unsupported":
            ET.SubElement(case, "skipped", message=c.get("error") or "")
        elif c in bad:
            failure = ET.SubElement(case, "failure", message=f"{c['status']}: {c.get('error') or ''}", type="SweepCell")
            failure.text = c.get("error") or c["status"]
    root = ET.Element("testsuites", name="infopt", tests=suite.get("tests"), failures=suite.get("failures"))
    root.append(suite)
    ET.indent(root)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"
