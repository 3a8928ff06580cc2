"""Which INT8 graph to ship, chosen by measurement rather than by rule.

The same quantized layers can be written several ways, and which one ONNX Runtime runs fastest
depends on the model and the CPU: the data type of the activations (u8 or s8), per-channel or
per-tensor weight scales, and which layers stay in float because quantizing them drags a cheap op
into a slow integer kernel (a quantized Linear after a MaxPool makes ONNX Runtime pool in uint8,
which its CPU kernels do about ten times slower than in float). A handful of such variants is built
from the layers the accuracy fallback kept in INT8; each must hold the drift budget, and those that do
are timed together with the FP32 model by the one timing protocol (``validators/timing.py``: interleaved
blocks, the median ratio to FP32 over ABBA trials and its confidence bounds), and chosen by it. The
fastest that holds the budget ships; when none is faster than FP32, FP32 ships unless the user insists on INT8, and the
report says so with the figures. Every variant tried is recorded.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from infopt.core.errors import first_line
from infopt.quantize import onnx_int8
from infopt.quantize.onnx_int8 import Layer
from infopt.quantize.sensitivity import Budget, output_drift
from infopt.runtime.backends.onnxruntime import OrtRunner
from infopt.validators import timing
from infopt.validators.timing import RatioEstimate, mix_text, weighted_geomean

SHAPE_OPS = ("Reshape", "Flatten", "Transpose", "Squeeze", "Unsqueeze", "Identity")
POOL_OPS = ("MaxPool", "AveragePool", "GlobalMaxPool", "GlobalAveragePool")
FP32 = "fp32"


@dataclass
class Variant:
    name: str
    why: str
    nodes: list[str]
    """the layers in INT8"""
    write: Callable[[Path], Path]
    """writes the model to a path and returns it"""


@dataclass
class Tried:
    name: str
    why: str
    nodes: list[str]
    path: Path | None = None
    drift: dict = field(default_factory=dict)
    holds: bool = False
    ratios: list[RatioEstimate] = field(default_factory=list)
    error: str | None = None
    runner: OrtRunner | None = field(default=None, repr=False)
    """the session its drift was measured with, reused to time it"""

    weights: dict[int, float] | None = None
    """each batch size's share of requests (``--batch-mix``), or None for equal weights"""

    @property
    def speed(self) -> float | None:
        """Geometric mean over batch sizes of this variant's time / FP32's time (below 1: faster), each size
        weighted by its share of requests when :attr:`weights` are declared."""
        return weighted_geomean({r.batch: r.ratio for r in self.ratios}, self.weights)

    def to_json(self) -> dict:
        return {"name": self.name, "why": self.why, "int8_layers": len(self.nodes), "drift": self.drift,
                "holds_budget": self.holds, "error": self.error, "speed_vs_fp32": self.speed,
                "ratios": [r.to_json() for r in self.ratios]}


def pooled_layers(model, layers: list[Layer]) -> list[str]:
    """Layers whose input comes from a pooling op through shape-only ops: quantizing them makes
    ONNX Runtime move the quantization above the pool and pool in integers."""
    producers = {out: node for node in model.graph.node for out in node.output}
    found = []
    for layer in layers:
        node = producers.get(layer.activation)
        while node is not None and node.op_type in SHAPE_OPS:
            node = producers.get(node.input[0]) if node.input else None
        if node is not None and node.op_type in POOL_OPS:
            found.append(layer.node)
    return found


def candidates(mode: str, src: Path, model, layers: list[Layer], included: list[str],
               ranges: dict | None) -> list[Variant]:
    """The variants worth timing for ``mode`` (static on ONNX Runtime's CPU placement, or dynamic)."""
    variants: list[Variant] = []

    def add(name: str, why: str, nodes: list[str], **settings) -> None:
        if not nodes:
            return
        if mode == "static":
            variants.append(Variant(name, why, nodes, lambda dst, n=nodes, s=settings: onnx_int8.quantize_static(
                src, dst, ranges, n, placement="onnxruntime", **s)))
        else:
            variants.append(Variant(name, why, nodes, lambda dst, n=nodes, s=settings: onnx_int8.quantize_dynamic(
                src, dst, n, **s)))

    add("u8 activations, per-channel weights", "ONNX Runtime's u8s8 integer kernels (the default placement)", included)
    pooled = set(pooled_layers(model, layers))
    if mode == "static" and pooled & set(included):
        add("u8 activations, per-channel weights, layers after pooling in float",
            f"keeps {', '.join(sorted(pooled & set(included)))} in float so the pooling before them stays float",
            [n for n in included if n not in pooled])
    if mode == "static":
        add("s8 activations, per-channel weights", "signed activations (s8s8 kernels)", included, activation="int8")
    add("u8 activations, per-tensor weights", "one scale per weight tensor", included, per_channel=False)
    if mode == "static":
        add("s8 activations, per-tensor weights", "ONNX Runtime quantize_static's defaults (S8S8 QDQ, per-tensor)",
            included, activation="int8", per_channel=False)
    return variants


def try_variants(variants: list[Variant], workdir: Path, batches: list[dict], reference: list[np.ndarray],
                 budget: Budget, say: Callable[[str], None]) -> list[Tried]:
    """Build each variant and measure its drift; a variant that fails to build is recorded, not fatal."""
    tried = []
    for index, variant in enumerate(variants):
        entry = Tried(variant.name, variant.why, variant.nodes)
        say(f"INT8 variant {index + 1}/{len(variants)}: {variant.name}")
        try:
            entry.path = variant.write(workdir / f"variant-{index}.onnx")
            entry.runner = OrtRunner(entry.path)
            outs = [entry.runner.run(b) for b in batches]
            entry.drift = output_drift(reference, [np.concatenate([o[i] for o in outs]) for i in range(len(reference))])
            entry.holds = budget.holds(entry.drift)
        except Exception as exc:  # noqa: BLE001 - a variant ONNX Runtime cannot quantize or run is skipped
            entry.error = f"{type(exc).__name__}: {first_line(exc)}"
        tried.append(entry)
    return tried


def timing_feeds(batches: list[dict], sizes: list[int], spec=None) -> dict[int, dict[str, np.ndarray]]:
    """Inputs at each batch size, cut from (and, when there are too few samples, repeating) ``batches``. With the
    model's InputSpec, every other dynamic dim (a sequence's length) is cut or repeated to its opt: the shape the
    build's latency step times and the model is declared to serve, whatever length the ``--val`` data has."""
    joined = {name: np.concatenate([b[name] for b in batches]) for name in batches[0]}
    if spec is not None:
        joined = {name: _at_opt(value, spec, name) for name, value in joined.items()}
    have = len(next(iter(joined.values())))
    feeds = {}
    for size in sizes:
        rows = np.arange(size) % have
        feeds[size] = {name: np.ascontiguousarray(value[rows]) for name, value in joined.items()}
    return feeds


def _at_opt(value: np.ndarray, spec, name: str) -> np.ndarray:
    tensor = next((t for t in spec.inputs if t.name == name), None)
    if tensor is None or len(tensor.shape) != value.ndim:
        return value
    for axis, dim in enumerate(tensor.shape):
        if axis and isinstance(dim, str) and dim != spec.batch_symbol and value.shape[axis] != spec.dims[dim].opt:
            value = np.take(value, np.arange(spec.dims[dim].opt) % value.shape[axis], axis=axis)
    return value


def time_against_fp32(tried: list[Tried], fp32: Path, feeds: dict[int, dict], trials: int,
                      say: Callable[[str], None]) -> None:
    """Time every variant that holds the budget together with the FP32 model (``timing.measure``, FP32 the
    baseline): ``trials`` ABBA trials per batch size, each block lasting ``timing.MIN_BLOCK_S`` (one run of
    a model that takes longer)."""
    timed = [t for t in tried if t.holds and t.path is not None]
    if not timed:
        return
    say(f"timing {len(timed)} INT8 variant{'s' if len(timed) > 1 else ''} against FP32")
    runners = {FP32: OrtRunner(fp32).run, **{t.name: (t.runner or OrtRunner(t.path)).run for t in timed}}
    found = timing.measure(runners, feeds, warmup=3, iterations=2 * trials, blocks=2 * trials, tolerance=0,
                           baseline=FP32)
    for entry in timed:
        entry.ratios = found.ratios[entry.name]


def choose(tried: list[Tried], keep_int8: bool, weights: dict[int, float] | None = None) -> tuple[Tried | None, str]:
    """The variant to ship (None: FP32) and why, by ``timing.choose``, each batch size weighted by its share of
    requests when ``weights`` are declared. ``tried`` is not empty; its first entry is the model the accuracy
    fallback confirmed."""
    for entry in tried:
        entry.weights = weights
    picked = timing.choose({t.name: t.ratios for t in tried if t.holds}, weights, must_beat_baseline=not keep_int8)
    if picked.best is None:
        held = [t for t in tried if t.holds]
        if held:
            return held[0], "the first variant that held the budget (none could be timed)"
        return tried[0], "no INT8 variant held the drift budget; the first is kept, and the verdict says so"
    best = next(t for t in tried if t.name == picked.best)
    figures = "; ".join(f"batch {r.batch}: {r.candidate_p50_ms:.3f} ms vs FP32 {r.baseline_p50_ms:.3f} ms "
                        f"(ratio {r.ratio:.2f}, {r.confidence:.0%} bounds {r.lower:.2f}-{r.upper:.2f})" for r in best.ratios)
    if weights:
        figures += f"; weighted by the declared batch mix ({mix_text(weights)})"
    if best.speed < 1.0:
        return best, f"the fastest INT8 variant that held the budget, {1 / best.speed:.2f}x FP32's speed ({figures})"
    slower = (f"INT8 is slower than FP32 for this model here: the fastest variant, {best.name}, took "
              f"{best.speed:.2f}x FP32's time ({figures})")
    if keep_int8:
        return best, slower + "; shipped INT8 as required"
    return None, slower + "; shipped FP32 (--require-precision ships INT8 anyway)"
