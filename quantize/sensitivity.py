"""Sensitivity: how much each quantized layer adds to the output drift, and the fallback.

A *probe* is the FP32 ONNX model with every layer's INT8 rounding inserted behind a switch:
its activation input goes through QuantizeLinear/DequantizeLinear (with the calibrated range
for static INT8, or DynamicQuantizeLinear for dynamic INT8) and its weight is blended with its
per-channel int8 round trip, each scaled by one element of an extra ``infopt_qmask`` input. One
ONNX Runtime session then measures any set of layers in INT8: only layer ``i`` for its
sensitivity, all but the excluded ones for a fallback step. The probe never ships; the real
quantized model is built from the chosen set and validated on its own.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from infopt.core.errors import UsageError
from infopt.core.threads import ort_session_options
from infopt.core.work_folders import work_folder
from infopt.quantize.onnx_int8 import Layer
from infopt.validators import metrics
from infopt.validators.drift import worst
from infopt.validators.verdict import CHECKS

MASK = "infopt_qmask"
LOWER_IS_BETTER = tuple(metric for _, metric, kind in CHECKS if kind == "max")
THRESHOLD_OF = {metric: threshold for threshold, metric, _ in CHECKS}
"""Budget metric -> the validation threshold that checks the same figure on the --val data."""


MARGIN = 0.02
"""how much stricter than the budget a selection is (:meth:`Budget.with_margin`); the largest gap measured
between the INT8 pass's figure and the build's verdict on the same data was 0.35 % of the way to exact
(all-MiniLM-L6-v2, dynamic INT8: cosine 0.990486 against 0.990451, from ONNX Runtime's offline fusions)"""


@dataclass(frozen=True)
class Budget:
    """A drift budget: one metric and the bound it must meet (>= for similarity, <= for error)."""

    metric: str
    threshold: float

    def holds(self, drift: dict) -> bool:
        value = drift.get(self.metric)
        if value is None:
            return True
        return value <= self.threshold if self.metric in LOWER_IS_BETTER else value >= self.threshold

    def badness(self, drift: dict) -> float:
        """Larger is worse; ties (top-1 agreement is coarse) are broken by SQNR."""
        value = drift.get(self.metric) or 0.0
        main = value if self.metric in LOWER_IS_BETTER else -value
        return main * 1e6 - (drift.get("sqnr_db") or 0.0)

    def loss(self, drift: dict) -> float:
        """How far the budget's metric is from an exact output (0: exact), on a scale where the
        losses of different layers can be divided by the milliseconds they save: the error itself,
        1 - similarity, or the noise power 10^(-SQNR/10)."""
        value = drift.get(self.metric)
        if value is None:
            return 0.0
        if self.metric in LOWER_IS_BETTER:
            return max(float(value), 0.0)
        if self.metric == "sqnr_db":
            return 10 ** (-float(value) / 10)
        return max(1.0 - float(value), 0.0)

    def with_margin(self) -> "Budget":
        """The budget a selection holds itself to, so that the model it picks still meets this one once the
        graph is optimized for the runtime (fusions round a little differently): 2 % of the way from the
        threshold to an exact output (cosine 0.99 -> 0.9902), 2 % less error, or 0.2 dB more SQNR."""
        if self.metric in LOWER_IS_BETTER:
            return Budget(self.metric, self.threshold * (1 - MARGIN))
        if self.metric == "sqnr_db":
            return Budget(self.metric, self.threshold + 10 * MARGIN)
        return Budget(self.metric, self.threshold + MARGIN * max(1.0 - self.threshold, 0.0))

    def __str__(self) -> str:
        return f"{self.metric} {'<=' if self.metric in LOWER_IS_BETTER else '>='} {self.threshold:g}"

    @property
    def threshold_name(self) -> str:
        return THRESHOLD_OF[self.metric]

    @classmethod
    def parse(cls, text: "str | Budget") -> "Budget":
        """``metric=value``, e.g. ``cosine_mean=0.995`` or ``top1=0.99``."""
        if isinstance(text, Budget):
            return text
        metric, sep, value = str(text).partition("=")
        metric = metric.strip()
        fix = f"write METRIC=VALUE with METRIC one of {', '.join(THRESHOLD_OF)}, e.g. cosine_mean=0.995"
        if not sep or metric not in THRESHOLD_OF:
            raise UsageError(f"drift budget {text!r} names no known metric", fix=fix)
        try:
            return cls(metric, float(value))
        except ValueError:
            raise UsageError(f"drift budget {text!r}: {value!r} is not a number", fix=fix) from None


class Probe:
    def __init__(self, model_path: Path, layers: list[Layer], ranges: dict[str, tuple[float, float]] | None,
                 *, symmetric: bool = False):
        import onnx
        import onnxruntime as ort

        model = onnx.load(str(model_path))
        _insert_switches(model, layers, ranges, symmetric)
        self._tmp = work_folder("probe")
        path = Path(self._tmp.name) / "probe.onnx"
        onnx.save(model, str(path), save_as_external_data=True, location="probe.onnx.data")
        options = ort_session_options(optimize=False)
        self.session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        self.layers = layers

    def run(self, batches: list[dict[str, np.ndarray]], mask: np.ndarray) -> list[np.ndarray]:
        outs = [self.session.run(None, {**b, MASK: mask.astype(np.float32)}) for b in batches]
        return [np.concatenate([o[i] for o in outs]) for i in range(len(outs[0]))]

    def reference(self, batches: list[dict[str, np.ndarray]]) -> list[np.ndarray]:
        """The FP32 outputs: every switch off (exactly the original model)."""
        return self.run(batches, np.zeros(len(self.layers)))

    def drift(self, batches, reference: list[np.ndarray], mask: np.ndarray) -> dict:
        return output_drift(reference, self.run(batches, mask))

    def close(self) -> None:
        self._tmp.cleanup()


def first_samples(batches: list[dict], samples: int) -> list[dict]:
    """The first ``samples`` samples of ``batches`` (the last batch cut where needed)."""
    out, total = [], 0
    for batch in batches:
        if total >= samples:
            break
        take = min(len(next(iter(batch.values()))), samples - total)
        out.append({k: v[:take] for k, v in batch.items()})
        total += take
    return out


def output_drift(reference: list[np.ndarray], candidate: list[np.ndarray]) -> dict:
    """Drift figures over all outputs (each concatenated over the batches), the worst of each."""
    return worst([metrics.drift(r, c) for r, c in zip(reference, candidate)])


def rank(probe: Probe, batches, budget: Budget, progress: Callable[[str], None] | None = None) -> list[dict]:
    """Each layer's drift when it alone is INT8, most sensitive first."""
    n = len(probe.layers)
    reference = probe.reference(batches)
    rows = []
    for i, layer in enumerate(probe.layers):
        if progress:
            progress(f"sensitivity {i + 1}/{n}: {layer.node}")
        mask = np.zeros(n)
        mask[i] = 1.0
        drift = probe.drift(batches, reference, mask)
        rows.append({"layer": layer.node, "op": layer.op, "module": layer.module, "drift": drift,
                     "badness": budget.badness(drift)})
    rows.sort(key=lambda r: -r["badness"])
    return rows


def order_by_cost(ranked: list[dict], saved_ms: dict[str, float], budget: Budget) -> list[dict]:
    """``ranked`` reordered for the fallback by drift per millisecond saved, worst first: layers whose
    INT8 form saves no time (or costs time) go first, most drift first; then the rest by the budget's
    loss over the milliseconds they save, ties (a coarse metric like top-1) broken by SQNR noise
    power per millisecond. Each row gains ``ms_saved`` and ``drift_per_ms``."""
    def noise(row: dict) -> float:
        return 10 ** (-(row["drift"].get("sqnr_db") or 0.0) / 10)

    rows = []
    for row in ranked:
        ms = float(saved_ms.get(row["layer"], 0.0))
        per_ms = budget.loss(row["drift"]) / ms if ms > 0 else None
        rows.append({**row, "ms_saved": ms, "drift_per_ms": per_ms})
    free = sorted((r for r in rows if r["ms_saved"] <= 0), key=lambda r: -r["badness"])
    paid = sorted((r for r in rows if r["ms_saved"] > 0),
                  key=lambda r: (-r["drift_per_ms"], -noise(r) / r["ms_saved"]))
    return free + paid


def choose_fallback(probe: Probe, batches, budget: Budget, ranked: list[dict] | Callable[[], list[dict]],
                    progress: Callable[[str], None] | None = None,
                    reference: list[np.ndarray] | None = None) -> tuple[list[str], list[dict]]:
    """Exclude the most sensitive layers one at a time until the probe meets the budget.

    ``ranked`` is :func:`rank`'s list, or a function that makes it: then the layers are ranked only
    when the model with every layer in INT8 misses the budget (ranking runs the model once per
    layer). ``reference`` is the FP32 output on ``batches`` when the caller has it already.
    Returns the excluded layer names and one step record per evaluation."""
    index = {layer.node: i for i, layer in enumerate(probe.layers)}
    reference = probe.reference(batches) if reference is None else reference
    excluded: list[str] = []
    steps = []
    order = None
    while True:
        mask = np.ones(len(index))
        for name in excluded:
            mask[index[name]] = 0.0
        drift = probe.drift(batches, reference, mask)
        steps.append({"excluded": len(excluded), "drift": drift, "holds": budget.holds(drift)})
        if progress:
            progress(f"fallback: {len(excluded)} layer(s) in FP32, {budget.metric}={drift.get(budget.metric):.5g}")
        if budget.holds(drift):
            break
        order = order if order is not None else (ranked() if callable(ranked) else ranked)
        remaining = [row["layer"] for row in order if row["layer"] not in excluded]
        if not remaining:
            break
        excluded.append(remaining[0])
    return excluded, steps


def _fake_quant_weight(w: np.ndarray, axis: int) -> np.ndarray:
    reduce = tuple(a for a in range(w.ndim) if a != axis)
    scale = np.abs(w).max(axis=reduce, keepdims=True) / 127.0
    scale = np.where(scale == 0, 1.0, scale)
    return (np.clip(np.round(w / scale), -127, 127) * scale).astype(np.float32)


def activation_qparams(lo: float, hi: float, symmetric: bool) -> tuple[np.ndarray, np.ndarray]:
    """Scale and zero point as ONNX Runtime's quantizer computes them for one tensor."""
    lo, hi = min(lo, 0.0), max(hi, 0.0)
    if symmetric:
        a = max(abs(lo), abs(hi))
        return np.array(max(a / 127.0, 1e-12), np.float32), np.array(0, np.int8)
    scale = max((hi - lo) / 255.0, 1e-12)
    return np.array(scale, np.float32), np.array(int(np.clip(round(-lo / scale), 0, 255)), np.uint8)


def _insert_switches(model, layers: list[Layer], ranges, symmetric: bool) -> None:
    from onnx import TensorProto, helper, numpy_helper

    inits = {i.name: i for i in model.graph.initializer}
    model.graph.input.append(helper.make_tensor_value_info(MASK, TensorProto.FLOAT, [len(layers)]))
    new_nodes: dict[str, list] = {}
    for i, layer in enumerate(layers):
        p = f"infopt_probe_{i}"
        nodes = [helper.make_node("Slice", [MASK, f"{p}_start", f"{p}_end"], [f"{p}_m"])]
        model.graph.initializer.extend([numpy_helper.from_array(np.array([i], np.int64), f"{p}_start"),
                                        numpy_helper.from_array(np.array([i + 1], np.int64), f"{p}_end")])
        if ranges is None:
            nodes.append(helper.make_node("DynamicQuantizeLinear", [layer.activation], [f"{p}_q", f"{p}_s", f"{p}_z"]))
            nodes.append(helper.make_node("DequantizeLinear", [f"{p}_q", f"{p}_s", f"{p}_z"], [f"{p}_dq"]))
        else:
            scale, zero = activation_qparams(*ranges[layer.activation], symmetric)
            model.graph.initializer.extend([numpy_helper.from_array(scale, f"{p}_s"),
                                            numpy_helper.from_array(zero, f"{p}_z")])
            nodes.append(helper.make_node("QuantizeLinear", [layer.activation, f"{p}_s", f"{p}_z"], [f"{p}_q"]))
            nodes.append(helper.make_node("DequantizeLinear", [f"{p}_q", f"{p}_s", f"{p}_z"], [f"{p}_dq"]))
        w = numpy_helper.to_array(inits[layer.weight])
        model.graph.initializer.append(numpy_helper.from_array(_fake_quant_weight(w, layer.channel_axis) - w, f"{p}_wd"))
        nodes += [helper.make_node("Sub", [f"{p}_dq", layer.activation], [f"{p}_ad"]),
                  helper.make_node("Mul", [f"{p}_ad", f"{p}_m"], [f"{p}_adm"]),
                  helper.make_node("Add", [layer.activation, f"{p}_adm"], [f"{p}_x"]),
                  helper.make_node("Mul", [f"{p}_wd", f"{p}_m"], [f"{p}_wdm"]),
                  helper.make_node("Add", [layer.weight, f"{p}_wdm"], [f"{p}_w"])]
        new_nodes[layer.node] = nodes
    by_name = {layer.node: i for i, layer in enumerate(layers)}
    rebuilt = []
    for node in model.graph.node:
        if node.name in new_nodes:
            p = f"infopt_probe_{by_name[node.name]}"
            rebuilt.extend(new_nodes[node.name])
            node.input[0] = f"{p}_x"
            node.input[1] = f"{p}_w"
        rebuilt.append(node)
    del model.graph.node[:]
    model.graph.node.extend(rebuilt)
