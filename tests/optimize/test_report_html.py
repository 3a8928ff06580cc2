"""The HTML report, the roofline line and cost per million, on a model built and measured here.

The digits CNN is built for h100 (a target that declares bandwidth, peaks and a price) and for cpu
(one that declares none). The manifest's own ``validation.curve`` and ``validation.work`` are used
when the build wrote them; otherwise the curve is measured here on the built model's runner and
the work counted with ``count_work``, the same way the build does.
"""

from __future__ import annotations

from collections import defaultdict
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

import infopt
from infopt.core.manifest import read_manifest
from infopt.core.manifest_schema import Manifest
from infopt.report.html import to_html
from infopt.validators import timing
from infopt.validators.roofline import cost_notes, cost_per_million, count_work, roofline
from tests.support.manifests import typed_manifest

BATCHES = (1, 2, 4, 8, 16)
VOID = {"meta", "link", "br", "hr", "img", "input", "area", "base", "col", "embed", "source", "track", "wbr"}


class Doc(HTMLParser):
    """A strict reading of the report: every element closes in order; tables kept per section id."""

    def __init__(self, text: str):
        super().__init__(convert_charrefs=True)
        self.stack: list[tuple[str, dict[str, str]]] = []
        self.elements: list[tuple[str, dict[str, str], tuple[str, ...]]] = []
        self.rows: dict[str, list[list[str]]] = defaultdict(list)
        self.text: dict[str, str] = defaultdict(str)
        self.feed(text)
        self.close()
        assert not self.stack, f"unclosed elements: {[t for t, _ in self.stack]}"

    def _ids(self) -> tuple[str, ...]:
        return tuple(a["id"] for _, a in self.stack if "id" in a)

    def _section(self) -> str:
        return next((a.get("id", "") for t, a in reversed(self.stack) if t == "section"), "")

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        self.elements.append((tag, a, self._ids()))
        if tag in VOID:
            return
        self.stack.append((tag, a))
        if tag == "tr":
            self.rows[self._section()].append([])
        elif tag in ("td", "th"):
            self.rows[self._section()][-1].append("")

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.elements.append((tag, {k: v or "" for k, v in attrs}, self._ids()))

    def handle_endtag(self, tag: str) -> None:
        assert self.stack and self.stack[-1][0] == tag, f"</{tag}> closes {self.stack[-1:]}"
        self.stack.pop()

    def handle_data(self, data: str) -> None:
        for ident in self._ids():
            self.text[ident] += data
        if self.stack and self.stack[-1][0] in ("td", "th"):
            self.rows[self._section()][-1][-1] += data

    def inside(self, ident: str, tag: str) -> list[dict[str, str]]:
        return [a for t, a, ids in self.elements if t == tag and ident in ids]

    def ids(self) -> set[str]:
        return {a["id"] for _, a, _ in self.elements if "id" in a}

    def body_rows(self, section: str) -> dict[str, list[str]]:
        """Data rows of a section's table by their first cell (the batch)."""
        return {r[0]: r for r in self.rows[section][1:]}


def _curve_and_work(out: Path, model: nn.Module, x: np.ndarray) -> Manifest:
    manifest = read_manifest(out)
    v = manifest.validation
    if not v.curve:
        runner = infopt.load(out)
        stats = timing.measure({"infopt": runner.run}, {b: {"x": x[:b]} for b in BATCHES}, warmup=3, iterations=20,
                               devices={"infopt": runner.device}).stats
        v.curve = [{k: val for k, val in s.to_json().items() if k != "runner"} for s in stats]
    if not v.work:
        v.work = count_work(model, {"x": x[:8]}, ["x"], manifest.files[manifest.artifacts.model].bytes)
    return manifest


@pytest.fixture(scope="module")
def built(digits, tmp_path_factory) -> dict[str, dict[str, Any]]:
    model, data = digits
    x = data["val"][0]
    root = tmp_path_factory.mktemp("html")
    found = {}
    for target in ("h100", "cpu"):
        result = infopt.build(model, example_inputs=(torch.from_numpy(x[:2]),), target=target, backend="onnxruntime",
                              output=root / target, progress=False, dims=["batch=1:8:16"], batch_sizes=[1, 16])
        found[target] = _curve_and_work(result.output_dir, model, x)
    return found


def test_html_report_of_a_built_model(built):
    manifest = built["h100"]
    curve = sorted(manifest.validation.curve, key=lambda p: p["batch"])
    work = manifest.validation.work
    text = to_html(manifest)
    doc = Doc(text)

    assert "http://" not in text and "https://" not in text and "url(" not in text and "@import" not in text
    assert not [t for t, a, _ in doc.elements if "src" in a or "href" in a or t in ("script", "link", "img", "iframe")]
    assert doc.text["summary"].count(f"infopt build: {manifest.name}") == 1

    assert {"latency-plot", "throughput-plot", "roofline-plot"} <= doc.ids()
    for plot in ("latency-plot", "throughput-plot", "roofline-plot"):
        assert doc.inside(plot, "title"), f"{plot} has no <title>"
    batches = [p["batch"] for p in curve]
    for series in ("p50", "p90", "p99"):
        marks = [a for a in doc.inside("latency-plot", "circle") if a["data-series"] == series]
        assert [int(a["data-batch"]) for a in marks] == batches
    assert [int(a["data-batch"]) for a in doc.inside("throughput-plot", "circle")] == batches
    assert [int(a["data-batch"]) for a in doc.inside("roofline-plot", "circle")] == batches
    assert len(doc.inside("roofline-plot", "polyline")) == 1  # the roof; measured points are not joined

    rows = doc.body_rows("section-latency-by-batch-size-ms")
    assert list(rows) == [str(b) for b in batches]
    for p in curve:
        assert rows[str(p["batch"])][1:4] == [f"{p['p50_ms']:.3f}", f"{p['p90_ms']:.3f}", f"{p['p99_ms']:.3f}"]
    assert rows["1"][1] == f"{curve[0]['p50_ms']:.3f}"
    lat_rows = doc.rows["section-latency-ms"][1:]
    assert [r[2] for r in lat_rows] == [f"{r.p50_ms:.3f}" for r in manifest.validation.latency]

    flops, weight, io = work["flops_per_sample"], work["weight_bytes"], work["io_bytes_per_sample"]
    assert flops > 0 and weight > 0 and io > 0
    roof_rows = doc.body_rows("section-roofline")
    cost_rows = doc.body_rows("section-cost-per-million-predictions")
    for p in curve:
        b, thr = p["batch"], p["throughput"]
        intensity = flops * b / (weight + b * io)
        achieved = flops * thr / 1e12
        roof = min(67.0, intensity * 3350 / 1000)
        assert roof_rows[str(b)][2:5] == [format(achieved, ".4g"), format(intensity, ".4g"), format(roof, ".4g")]
        assert roof_rows[str(b)][5] == format(100 * achieved / roof, ".3g")
        assert cost_rows[str(b)][2] == format(3.0 / 3600 / thr * 1e6, ".4g")
    assert "not a statement about the target" in doc.text["section-roofline"]  # measured on cpu, target is cuda
    assert "not a statement about the target" in doc.text["section-cost-per-million-predictions"]


def test_cpu_target_roof_is_this_machines_measured_one_and_no_price_means_no_cost(built):
    manifest = built["cpu"]
    doc = Doc(to_html(manifest))
    assert "latency-plot" in doc.ids() and "roofline-plot" in doc.ids()
    target = manifest.target
    assert target.measured.startswith("measured on this machine") and target.memory_bandwidth_gbs > 0
    assert "measured on this machine" in doc.text["section-roofline"]
    row = doc.body_rows("section-roofline")["1"]
    curve = {p["batch"]: p for p in manifest.validation.curve}
    work = manifest.validation.work
    achieved = work["flops_per_sample"] * curve[1]["throughput"] / 1e12
    intensity = work["flops_per_sample"] / (work["weight_bytes"] + work["io_bytes_per_sample"])
    roof = min(target.peak_tflops["fp32"], intensity * target.memory_bandwidth_gbs / 1e3)
    assert row[2:5] == [format(achieved, ".4g"), format(intensity, ".4g"), format(roof, ".4g")]
    assert doc.rows["section-cost-per-million-predictions"] == []
    assert "pass --price-per-hour" in doc.text["section-cost-per-million-predictions"]
    assert cost_per_million(manifest) == []


def test_html_without_a_curve_and_with_hostile_text(built):
    manifest = built["cpu"].model_copy(deep=True)
    manifest.validation.curve = []
    manifest.name = '<script>alert("x")</script>'
    text = to_html(manifest)
    doc = Doc(text)
    assert not [t for t, _, _ in doc.elements if t in ("script", "svg")]
    assert "&lt;script&gt;" in text
    assert "no latency, throughput or roofline plots" in doc.text["curve-note"]
    assert roofline(manifest) is None


def _made_up(price: float | None = 3.6, bandwidth: float | None = 1000.0, device: str = "cuda (tensorrt)",
             precision: str = "int4") -> Manifest:
    return typed_manifest(
        precision=precision,
        target={"name": "gpu", "device": "cuda", "description": "Some GPU", "memory_bandwidth_gbs": bandwidth,
                "peak_tflops": {"fp16": 100.0, "fp32": 10.0}, "price_per_hour": price},
        validation={"device": device,
                    "work": {"flops_per_sample": 2e9, "weight_bytes": 10**9, "io_bytes_per_sample": 10**6, "method": "made up"},
                    "curve": [{"batch": 1000, "throughput": 20000.0}, {"batch": 1, "throughput": 50.0}]})


def test_roofline_math_by_hand():
    line = roofline(_made_up())
    assert line["roof_dtype"] == "fp16" and line["peak_tflops"] == 100.0  # int4 is W4A16: the fp16 peak
    assert line["ridge_intensity"] == pytest.approx(100.0)  # 100 TFLOP/s / 1000 GB/s
    one, big = line["points"]
    assert one["batch"] == 1 and big["batch"] == 1000
    intensity = 2e9 / (1e9 + 1e6)  # FLOPs / (weights + one sample's io)
    assert one["intensity"] == pytest.approx(intensity)
    assert one["achieved_tflops"] == pytest.approx(0.1)  # 2e9 FLOPs x 50/s
    assert one["roof_tflops"] == pytest.approx(intensity)  # memory-bound: intensity x 1 TB/s
    assert one["fraction_of_roof"] == pytest.approx(0.1 / intensity) and one["bound"] == "memory"
    assert big["intensity"] == pytest.approx(1000.0)  # 2e12 / (1e9 + 1e9)
    assert big["achieved_tflops"] == pytest.approx(40.0) and big["roof_tflops"] == 100.0
    assert big["fraction_of_roof"] == pytest.approx(0.4) and big["bound"] == "compute"
    assert any("only if that GPU is a Some GPU" in n for n in line["notes"])
    assert any("weight-only" in n for n in line["notes"])

    on_cpu = roofline(_made_up(device="cpu (onnxruntime CPUExecutionProvider)", precision="fp32"))
    assert on_cpu["points"][1]["roof_tflops"] == 10.0 and on_cpu["points"][1]["fraction_of_roof"] == pytest.approx(4.0)
    assert any("not a statement about the target" in n for n in on_cpu["notes"])

    no_bw = roofline(_made_up(bandwidth=None))
    assert [p["roof_tflops"] for p in no_bw["points"]] == [None, None] and not no_bw["has_roof"]
    assert no_bw["points"][1]["achieved_tflops"] == pytest.approx(40.0)
    assert any("declares no memory bandwidth" in n for n in no_bw["notes"])

    unknown = _made_up()
    unknown.validation.work["flops_per_sample"] = None
    line = roofline(unknown)
    assert all(p["achieved_tflops"] is None and p["fraction_of_roof"] is None for p in line["points"])
    assert any("FLOPs per sample are unknown" in n for n in line["notes"])


def test_cost_per_million_by_hand():
    rows = cost_per_million(_made_up(price=3.6))
    assert [r["batch"] for r in rows] == [1, 1000]
    assert rows[0]["usd_per_million"] == pytest.approx(3.6 / 3600 / 50 * 1e6)  # 20 USD
    assert rows[1]["usd_per_million"] == pytest.approx(0.05)  # 0.001 USD/s / 20000 samples/s x 1e6
    assert any("only if that GPU" in n for n in cost_notes(_made_up()))
    assert cost_per_million(_made_up(price=None)) == []
    assert "declares no price_per_hour" in cost_notes(_made_up(price=None))[0]


def test_count_work_counts_linear_flops_and_bytes():
    layer = nn.Linear(64, 32).eval()
    feed = {"x": np.random.default_rng(0).standard_normal((4, 64), dtype=np.float32)}
    work = count_work(layer, feed, ["x"], weight_bytes=(64 * 32 + 32) * 4, weight_source="parameter bytes")
    assert work["flops_per_sample"] == 2 * 64 * 32
    assert work["io_bytes_per_sample"] == (64 + 32) * 4
    assert work["weight_bytes"] == (64 * 32 + 32) * 4
    assert "FlopCounterMode" in work["method"] and "parameter bytes" in work["method"]

    outputs = [np.zeros((4, 32), np.float32)]
    onnx_only = count_work(None, feed, ["x"], weight_bytes=123, outputs=outputs)
    assert onnx_only["flops_per_sample"] is None and "no eager torch module" in onnx_only["method"]
    assert onnx_only["io_bytes_per_sample"] == (64 + 32) * 4
    assert "inputs only" in count_work(None, feed, ["x"], weight_bytes=123)["method"]
