"""The build report as one self-contained HTML file: the report's tables plus inline SVG charts.

The tables are ``infopt.report.markdown.sections`` (the same sections as ``report.md``) plus the latency
curve, roofline and cost sections of ``infopt.validators.roofline``, so the HTML and the markdown
never disagree. The charts are small hand-drawn SVG (no plotting library, no scripts, fonts,
images or links): latency and throughput against batch size on a log2 axis, and a log-log roofline
with the target's roof when the target declares its bandwidth and peak and the FLOPs are known.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from html import escape
from typing import Any

from infopt.core.manifest_schema import Manifest
from infopt.report.markdown import Section, sections
from infopt.report.performance import curve_section, roofline_section
from infopt.validators.roofline import measured_curve, roofline

WIDTH, HEIGHT = 640, 340
LEFT, RIGHT, TOP, BOTTOM = 72, 24, 34, 52

CSS = """
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; color: #1f2328; margin: 0; background: #fff; }
main { max-width: 1040px; margin: 0 auto; padding: 24px; }
h1 { font-size: 22px; margin: 0 0 12px; } h2 { font-size: 17px; margin: 28px 0 8px; }
table { border-collapse: collapse; margin: 6px 0; font-variant-numeric: tabular-nums; }
th, td { border: 1px solid #d0d7de; padding: 3px 9px; text-align: left; vertical-align: top; }
th { background: #f6f8fa; font-weight: 600; }
td.num { text-align: right; }
ul.notes { color: #57606a; margin: 6px 0; padding-left: 20px; }
li.warn, .fail { color: #cf222e; font-weight: 600; } .pass { color: #1a7f37; font-weight: 600; }
p.note { color: #57606a; font-style: italic; }
figure { margin: 10px 0; } svg { background: #fff; border: 1px solid #d0d7de; max-width: 100%; height: auto; }
svg text { font: 11px system-ui, sans-serif; fill: #1f2328; } svg .title { font-size: 13px; font-weight: 600; }
svg .grid { stroke: #eaeef2; } svg .axis { stroke: #57606a; }
svg .s0 { stroke: #0969da; fill: #0969da; } svg .s1 { stroke: #bf8700; fill: #bf8700; }
svg .s2 { stroke: #cf222e; fill: #cf222e; } svg .roof { stroke: #57606a; fill: none; stroke-width: 2; }
svg polyline.line { fill: none; stroke-width: 1.8; } svg .dash { stroke-dasharray: 5 3; }
"""


@dataclass
class _Axis:
    """A scale from data to a 0..1 fraction of the plot: linear, or log in ``base``."""

    lo: float
    hi: float
    base: float | None = None

    def frac(self, value: float) -> float:
        if self.base:
            lo, hi = math.log(self.lo, self.base), math.log(self.hi, self.base)
            return (math.log(value, self.base) - lo) / (hi - lo)
        return (value - self.lo) / (self.hi - self.lo)

    def ticks(self) -> list[float]:
        if self.base:
            first, last = round(math.log(self.lo, self.base)), round(math.log(self.hi, self.base))
            step = max(1, math.ceil((last - first) / 10))
            return [self.base ** k for k in range(first, last + 1, step)]
        step = _nice_step(self.hi - self.lo)
        return [self.lo + i * step for i in range(int(round((self.hi - self.lo) / step)) + 1)]


def _nice_step(span: float) -> float:
    raw = span / 5 if span > 0 else 1.0
    power = 10 ** math.floor(math.log10(raw))
    return next(m * power for m in (1, 2, 2.5, 5, 10) if m * power >= raw)


def linear_axis(values: list[float]) -> _Axis:
    top = max(values) if values and max(values) > 0 else 1.0
    step = _nice_step(top)
    return _Axis(0.0, step * math.ceil(top * 1.05 / step))


def log_axis(values: list[float], base: float) -> _Axis:
    positive = [v for v in values if v > 0] or [1.0]
    lo = base ** math.floor(math.log(min(positive), base) + 1e-9)
    hi = base ** math.ceil(math.log(max(positive), base) - 1e-9)
    return _Axis(lo, hi if hi > lo else lo * base, base)


def _tick_label(value: float) -> str:
    """Short tick text: 0.01, 250, 40k, 1.5M, 1e-05."""
    for scale, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= max(scale, 1e4):
            return f"{value / scale:g}{suffix}"
    if value and abs(value) < 1e-3:
        return f"{value:.0e}".replace("e-0", "e-")
    return f"{value:g}"


@dataclass
class Series:
    name: str
    points: list[tuple[float, float, int, str]]
    """(x, y, batch, hover text) for each marker"""
    css: str = "s0"
    dashed: bool = False
    labels: bool = False
    line: bool = True


@dataclass
class Chart:
    ident: str
    title: str
    xlabel: str
    ylabel: str
    x: _Axis
    y: _Axis
    series: list[Series] = field(default_factory=list)
    underlay: list[str] = field(default_factory=list)

    def px(self, value: float) -> float:
        return LEFT + self.x.frac(value) * (WIDTH - LEFT - RIGHT)

    def py(self, value: float) -> float:
        return HEIGHT - BOTTOM - self.y.frac(value) * (HEIGHT - TOP - BOTTOM)

    def render(self) -> str:
        out = [f'<svg id="{escape(self.ident)}" role="img" viewBox="0 0 {WIDTH} {HEIGHT}" width="{WIDTH}" '
               f'height="{HEIGHT}" aria-labelledby="{escape(self.ident)}-title">',
               f'<title id="{escape(self.ident)}-title">{escape(self.title)}</title>',
               f'<text class="title" x="{LEFT}" y="20">{escape(self.title)}</text>']
        out += self._axes()
        out += self.underlay
        for s in self.series:
            out += self._series(s)
        out += self._legend()
        out.append("</svg>")
        return "\n".join(out)

    def _axes(self) -> list[str]:
        x0, x1, y0, y1 = LEFT, WIDTH - RIGHT, HEIGHT - BOTTOM, TOP
        out = []
        for t in self.x.ticks():
            px = self.px(t)
            out.append(f'<line class="grid" x1="{px:.1f}" y1="{y1}" x2="{px:.1f}" y2="{y0}"/>')
            out.append(f'<text class="xtick" x="{px:.1f}" y="{y0 + 16}" text-anchor="middle">{escape(_tick_label(t))}</text>')
        for t in self.y.ticks():
            py = self.py(t)
            out.append(f'<line class="grid" x1="{x0}" y1="{py:.1f}" x2="{x1}" y2="{py:.1f}"/>')
            out.append(f'<text class="ytick" x="{x0 - 6}" y="{py + 4:.1f}" text-anchor="end">{escape(_tick_label(t))}</text>')
        out.append(f'<line class="axis" x1="{x0}" y1="{y0}" x2="{x1}" y2="{y0}"/>')
        out.append(f'<line class="axis" x1="{x0}" y1="{y0}" x2="{x0}" y2="{y1}"/>')
        out.append(f'<text class="xlabel" x="{(x0 + x1) / 2:.1f}" y="{HEIGHT - 12}" text-anchor="middle">'
                   f'{escape(self.xlabel)}</text>')
        cy = (y0 + y1) / 2
        out.append(f'<text class="ylabel" x="16" y="{cy:.1f}" text-anchor="middle" transform="rotate(-90 16 {cy:.1f})">'
                   f'{escape(self.ylabel)}</text>')
        return out

    def _series(self, s: Series) -> list[str]:
        css = f"{s.css} dash" if s.dashed else s.css
        coords = [(self.px(x), self.py(y), batch, text) for x, y, batch, text in s.points]
        out = [f'<g class="series" data-series="{escape(s.name)}">']
        if s.line and len(coords) > 1:
            line = " ".join(f"{cx:.1f},{cy:.1f}" for cx, cy, _, _ in coords)
            out.append(f'<polyline class="line {css}" points="{line}"/>')
        for cx, cy, batch, text in coords:
            out.append(f'<circle class="{s.css}" cx="{cx:.1f}" cy="{cy:.1f}" r="3.5" data-series="{escape(s.name)}" '
                       f'data-batch="{batch}"><title>{escape(text)}</title></circle>')
            if s.labels:
                out.append(f'<text class="point-label" x="{cx + 6:.1f}" y="{cy - 6:.1f}">b{batch}</text>')
        out.append("</g>")
        return out

    def _legend(self) -> list[str]:
        named = [s for s in self.series if s.name]
        out = []
        for i, s in enumerate(named):
            y = TOP + 8 + 15 * i
            x = WIDTH - RIGHT - 130
            dash = " dash" if s.dashed else ""
            if s.line:
                out.append(f'<line class="line {s.css}{dash}" x1="{x}" y1="{y}" x2="{x + 22}" y2="{y}" stroke-width="2"/>')
            else:
                out.append(f'<rect class="{s.css}" x="{x + 8}" y="{y - 3}" width="6" height="6"/>')
            out.append(f'<text x="{x + 28}" y="{y + 4}">{escape(s.name)}</text>')
        return out


def _batch_axis(batches: list[int]) -> _Axis:
    """Powers of two around the measured batch sizes; one batch size sits in the middle."""
    if len(set(batches)) == 1:
        return _Axis(batches[0] / 2, batches[0] * 2, 2)
    return log_axis([float(b) for b in batches], 2)


def latency_chart(curve: list[dict[str, Any]], device: str) -> str:
    """p50, p90 and p99 latency (ms) against batch size on a log2 axis."""
    batches = [p["batch"] for p in curve]
    x = _batch_axis(batches)
    values = [p[f"{key}_ms"] for p in curve for key in ("p50", "p90", "p99")]
    wide = min(values) > 0 and max(values) / min(values) > 20
    y = log_axis(values, 10) if wide else linear_axis(values)
    chart = Chart("latency-plot", f"Latency by batch size ({device})", "batch size (log2)",
                  "latency (ms, log)" if wide else "latency (ms)", x, y)
    for i, (key, dashed) in enumerate((("p50", False), ("p90", True), ("p99", True))):
        points = [(p["batch"], p[f"{key}_ms"], p["batch"], f"batch {p['batch']}: {key} {p[f'{key}_ms']:.3f} ms")
                  for p in curve]
        chart.series.append(Series(key, points, f"s{i}", dashed))
    return chart.render()


def throughput_chart(curve: list[dict[str, Any]], device: str) -> str:
    """Samples per second against batch size on a log2 axis."""
    batches = [p["batch"] for p in curve]
    x = _batch_axis(batches)
    y = linear_axis([p["throughput"] for p in curve])
    chart = Chart("throughput-plot", f"Throughput by batch size ({device})", "batch size (log2)", "samples / s", x, y)
    points = [(p["batch"], p["throughput"], p["batch"], f"batch {p['batch']}: {p['throughput']:.1f} samples/s")
              for p in curve]
    chart.series.append(Series("samples/s", points))
    return chart.render()


def roofline_chart(line: dict[str, Any]) -> str | None:
    """Log-log achieved TFLOP/s against FLOP/byte under the target's roof; None without a roof."""
    points = [p for p in line["points"] if p["intensity"] and p["achieved_tflops"]]
    if not line["has_roof"] or not points:
        return None
    peak, bandwidth, ridge = line["peak_tflops"], line["memory_bandwidth_gbs"], line["ridge_intensity"]
    intensities = [p["intensity"] for p in points]
    x = log_axis([min(intensities + [ridge]) / 2, max(intensities + [ridge]) * 2], 10)
    achieved = [p["achieved_tflops"] for p in points]
    y = log_axis([min(achieved) / 2, x.lo * bandwidth / 1e3, max(achieved + [peak]) * 2], 10)
    where = str(line["measured_on"] or "unrecorded device").split(" ", 1)[0]
    chart = Chart("roofline-plot", f"Roofline: target {line['target']} ({line['roof_dtype']} roof), points measured on {where}",
                  "arithmetic intensity (FLOP/byte, log)", "TFLOP/s (log)", x, y)
    start = x.lo
    roof = [(start, start * bandwidth / 1e3), (ridge, peak), (x.hi, peak)]
    coords = " ".join(f"{chart.px(a):.1f},{chart.py(b):.1f}" for a, b in roof)
    hover = f"roof: {bandwidth:g} GB/s, then {peak:g} TFLOP/s from {ridge:.4g} FLOP/byte"
    chart.underlay.append(f'<polyline class="roof" points="{coords}"><title>{escape(hover)}</title></polyline>')
    chart.underlay.append(f'<text x="{chart.px(ridge) + 4:.1f}" y="{chart.py(peak) - 6:.1f}">'
                          f'{escape(line["roof_dtype"])} peak {peak:g} TFLOP/s</text>')
    mid = math.sqrt(start * ridge)
    chart.underlay.append(f'<text x="{chart.px(mid) + 6:.1f}" y="{chart.py(mid * bandwidth / 1e3) + 14:.1f}">'
                          f"{bandwidth:g} GB/s</text>")
    measured = [(p["intensity"], p["achieved_tflops"], p["batch"],
                 f"batch {p['batch']}: {p['achieved_tflops']:.4g} TFLOP/s at {p['intensity']:.4g} FLOP/byte"
                 + (f", {100 * p['fraction_of_roof']:.3g}% of roof" if p["fraction_of_roof"] is not None else ""))
                for p in points]
    chart.series.append(Series(f"measured ({where})", measured, "s0", labels=True, line=False))
    return chart.render()


def _roofline_absent(line: dict[str, Any] | None) -> str:
    if line is None:
        return "No roofline: no latency curve was measured."
    reasons = [n for n in line["notes"] if n.startswith(("target ", "FLOPs per sample are unknown", "no work figures"))
               and ("declares no" in n or not n.startswith("target "))]
    return "No roofline plot: " + ("; ".join(reasons) if reasons else "no measured point has a known intensity") + "."


_NUMERIC = re.compile(r"^-?[\d.,]+(e[-+]?\d+)?(x|%| ms)?$")


def _cell(text: str, tag: str = "td") -> str:
    css = ' class="num"' if tag == "td" and _NUMERIC.match(text) else ""
    if tag == "td" and text in ("PASS", "pass"):
        css = ' class="pass"'
    elif tag == "td" and text in ("FAIL",):
        css = ' class="fail"'
    return f"<{tag}{css}>{escape(text)}</{tag}>"


def _slug(title: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", title.lower()).strip("-") or "section"


def section_html(section: Section, heading: str = "h2", ident: str | None = None) -> str:
    """One section: its title, its table (headers as the markdown has them) and its notes."""
    out = [f'<section id="{escape(ident or "section-" + _slug(section.title))}">',
           f"<{heading}>{escape(section.title)}</{heading}>"]
    if section.rows:
        out.append("<table>")
        if any(section.headers):
            out.append("<thead><tr>" + "".join(_cell(h, "th") for h in section.headers) + "</tr></thead>")
        out.append("<tbody>")
        out += ["<tr>" + "".join(_cell(str(c)) for c in row) + "</tr>" for row in section.rows]
        out.append("</tbody></table>")
    if section.notes:
        items = [f'<li class="warn">{escape(n)}</li>' if n.startswith(("failed", "WARNING")) else f"<li>{escape(n)}</li>"
                 for n in section.notes]
        out.append('<ul class="notes">' + "".join(items) + "</ul>")
    out.append("</section>")
    return "\n".join(out)


def _figures(manifest: Manifest, curve: list[dict[str, Any]], device: str) -> dict[str, str]:
    """The charts (or the note saying why there is none), by the title of the section they follow."""
    figures: dict[str, str] = {}
    if curve:
        figures[curve_section(manifest).title] = (f"<figure>{latency_chart(curve, device)}</figure>\n"
                                                  f"<figure>{throughput_chart(curve, device)}</figure>")
    line = roofline(manifest)
    section = roofline_section(manifest)
    if line is not None and section is not None:
        chart = roofline_chart(line)
        figures[section.title] = (f"<figure>{chart}</figure>" if chart
                                  else f'<p class="note" id="roofline-note">{escape(_roofline_absent(line))}</p>')
    return figures


def to_html(manifest: Manifest) -> str:
    """The whole report as one HTML document (inline CSS and SVG, nothing fetched)."""
    curve = measured_curve(manifest)
    figures = _figures(manifest, curve, manifest.validation.device or "unrecorded device")
    ordered = sections(manifest)
    body, curve_note = [], not curve
    for i, section in enumerate(ordered):
        body.append(section_html(section, "h1" if i == 0 else "h2", "summary" if i == 0 else None))
        body.append(figures.pop(section.title, ""))
        if curve_note and section.title.startswith("Latency"):
            body.append('<p class="note" id="curve-note">No latency-by-batch curve in this manifest (a model without a '
                        "batch dimension is timed at one shape only): no latency, throughput or roofline plots.</p>")
            curve_note = False
    title = ordered[0].title if ordered else f"infopt build: {manifest.name}"
    return "\n".join(["<!DOCTYPE html>", '<html lang="en">', "<head>", '<meta charset="utf-8">',
                      '<meta name="viewport" content="width=device-width, initial-scale=1">',
                      f"<title>{escape(title)}</title>", f"<style>{CSS}</style>", "</head>", "<body>", "<main>",
                      *[b for b in body if b], "</main>", "</body>", "</html>", ""])
