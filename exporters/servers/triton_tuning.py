"""Triton serving settings derived from a measured latency-versus-batch curve.

The build times the chosen model at a range of batch sizes (``manifest["validation"]["curve"]``:
one ``{"batch", "p50_ms", "p90_ms", "p99_ms", "mean_ms", "throughput", "iterations"}`` per size,
throughput in samples/s). :func:`tune` reads that curve and picks the dynamic batcher's preferred
batch sizes and queue delay, the instance group, and the warm-up requests; every choice comes
with a sentence quoting the figures it used, which the report shows (``report/performance.py``).

The rules, with ``base`` the smallest measured batch (normally 1) and ``best`` the batch with the
highest measured throughput:

- **Preferred batch sizes.** The *knee* is the smallest batch whose throughput reaches
  ``SATURATION_FRACTION`` of the best: past it, bigger batches add latency and little throughput.
  The preferred sizes are the knee and the best batch (deduplicated, sorted, at most
  ``max_batch``). When the knee is ``base`` itself, batching gains less than
  ``1 / SATURATION_FRACTION`` and there are no preferred sizes.
- **Queue delay.** ``QUEUE_DELAY_FRACTION`` of the p50 at the smallest preferred size, clamped to
  ``[MIN_QUEUE_DELAY_US, MAX_QUEUE_DELAY_US]``. A request that waits for company is delayed by at
  most that much, a fraction of what running the preferred batch costs anyway; waiting longer
  than the batch itself takes to run leaves the device idle for a gain the curve does not show.
  With no preferred sizes the delay is 0: requests that queue while the instance is busy are
  still batched, but none waits on purpose.
- **Instances.** A heuristic, not a measurement of concurrent instances. On CPU, one: ONNX
  Runtime and torch spread one run over all cores, so a second instance would split the same
  cores. On GPU, ``LOW_GAIN_GPU_INSTANCES`` when ``best / base`` throughput is below
  ``SECOND_INSTANCE_GAIN``: batching barely fills the device, so a second instance lets one
  request's copies and kernels overlap another's; otherwise one, since batches already fill it
  and a second instance doubles the memory held.
- **Warm-up.** One ``ModelWarmup`` per preferred size (or at the smallest allowed batch when there
  are none), ``WARMUP_COUNT`` runs each, so the first real requests do not pay for allocation,
  kernel selection or engine profiles. Float inputs get ``random_data``; integer and bool inputs
  ``zero_data``, since random integers would be out-of-range token ids or indices. Dims leave out
  the batch dim; dynamic dims other than batch take their ``opt`` from the spec.

With no batch dim (``max_batch`` 0) there is nothing to batch: no dynamic batching, one instance,
one warm-up at batch 1. With an empty curve, or one measured on another kind of device than the
target's (a GPU target built on a CPU machine), the batcher keeps its defaults: the batch dim's opt
and max preferred, ``DEFAULT_QUEUE_DELAY_US``, one instance; warm-up at those sizes.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Mapping

from infopt.core.errors import UsageError
from infopt.core.inputspec import InputSpec

TRITON_DTYPES = {"float32": "TYPE_FP32", "float16": "TYPE_FP16", "bfloat16": "TYPE_BF16", "float64": "TYPE_FP64",
                 "int64": "TYPE_INT64", "int32": "TYPE_INT32", "int16": "TYPE_INT16", "int8": "TYPE_INT8",
                 "uint8": "TYPE_UINT8", "bool": "TYPE_BOOL"}


SATURATION_FRACTION = 0.9
"""A batch has saturated throughput when it reaches this fraction of the best measured throughput."""
QUEUE_DELAY_FRACTION = 0.5
"""The queue delay is this fraction of the p50 latency at the smallest preferred batch size."""
MIN_QUEUE_DELAY_US = 50
"""Floor of the queue delay: below it the scheduler's own wake-up time is the same order as the wait."""
MAX_QUEUE_DELAY_US = 10_000
DEFAULT_QUEUE_DELAY_US = 100
"""The queue delay when there is no curve to derive one from (the untuned config's)."""
"""Ceiling of the queue delay: beyond 10 ms the wait is a latency a caller notices, whatever the model."""
SECOND_INSTANCE_GAIN = 1.5
"""On GPU, below this best/base throughput ratio batching barely fills the device."""
LOW_GAIN_GPU_INSTANCES = 2
"""GPU instances when batching gains less than ``SECOND_INSTANCE_GAIN``."""
WARMUP_COUNT = 3
"""Runs of each warm-up request when the model loads."""
FLOAT_DTYPES = ("float32", "float16", "bfloat16", "float64")
"""Inputs of these dtypes are warmed up with random data; all others with zeros."""


@dataclass
class Tuning:
    """Triton settings for one model: what goes in ``config.pbtxt`` and why."""

    instance_kind: str
    """``KIND_CPU`` or ``KIND_GPU``"""
    instance_count: int
    max_batch: int
    """the config's ``max_batch_size`` this tuning was derived for (0: no batch dim)"""
    dynamic_batching: bool
    preferred_batch_sizes: list[int] = field(default_factory=list)
    max_queue_delay_us: int = 0
    warmup: list[dict[str, Any]] = field(default_factory=list)
    """Triton ``ModelWarmup`` entries: name, batch_size, inputs {name: {data_type, dims, random_data|zero_data}}, count"""
    reasons: list[str] = field(default_factory=list)
    """one sentence per decision, quoting the measured figures it used"""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "Tuning":
        return cls(**dict(data))


def _ms(value: float) -> str:
    return f"{value:.3f} ms"


def _rate(value: float) -> str:
    return f"{value:.1f} samples/s"


def _points(curve: list[dict[str, Any]], max_batch: int) -> list[dict[str, Any]]:
    """The usable points, one per batch size (the last given wins), sorted by batch."""
    by_batch: dict[int, dict[str, Any]] = {}
    for point in curve:
        batch, throughput = int(point["batch"]), float(point["throughput"])
        if 1 <= batch <= max_batch and math.isfinite(throughput) and throughput > 0:
            by_batch[batch] = point
    return [by_batch[b] for b in sorted(by_batch)]


def warmup_entries(spec: InputSpec, max_batch: int, batch_sizes: list[int]) -> list[dict[str, Any]]:
    """One ``ModelWarmup`` entry per batch size; dims leave out the batch dim when ``max_batch`` > 0."""
    cut = 1 if max_batch > 0 else 0
    inputs = {}
    for t in spec.inputs:
        fill = "random_data" if t.dtype in FLOAT_DTYPES else "zero_data"
        inputs[t.name] = {"data_type": TRITON_DTYPES[t.dtype], "dims": list(spec.concrete_shape(t, "opt")[cut:]), fill: True}
    return [{"name": f"warmup_batch_{b}", "batch_size": b, "inputs": {k: dict(v) for k, v in inputs.items()},
             "count": WARMUP_COUNT} for b in batch_sizes]


def _instances(device: str, points: list[dict[str, Any]], base: dict[str, Any], best: dict[str, Any]) -> tuple[int, str]:
    if device != "cuda":
        return 1, ("one CPU instance: ONNX Runtime and torch already spread one run over all cores, so a second "
                   "instance would split the same cores (a heuristic, not a measurement of two instances)")
    if len(points) < 2:
        return 1, f"one GPU instance: only batch {base['batch']} was measured, which shows nothing about batching gain"
    gain = best["throughput"] / base["throughput"]
    quoted = (f"the best throughput ({_rate(best['throughput'])} at batch {best['batch']}) is {gain:.2f}x "
              f"batch {base['batch']}'s ({_rate(base['throughput'])})")
    if gain < SECOND_INSTANCE_GAIN:
        return LOW_GAIN_GPU_INSTANCES, (f"{LOW_GAIN_GPU_INSTANCES} GPU instances: {quoted}, under {SECOND_INSTANCE_GAIN}x, "
                                        "so batching barely fills the device and a second instance lets requests "
                                        "overlap (a heuristic, not a measurement of two instances)")
    return 1, (f"one GPU instance: {quoted}, at least {SECOND_INSTANCE_GAIN}x, so batches fill the device and a "
               "second instance would mostly add memory")


def _untuned(device: str, spec: InputSpec, max_batch: int, why: str) -> Tuning:
    kind = "KIND_GPU" if device == "cuda" else "KIND_CPU"
    batch = spec.dims[spec.batch_symbol].min if max_batch > 0 and spec.batch_symbol else 1
    warmup = warmup_entries(spec, max_batch, [batch])
    shape = f"batch {batch}" if max_batch > 0 else "the whole input shape (batch_size 1)"
    reasons = [f"no dynamic batching and one instance: {why}",
               f"warm-up: {WARMUP_COUNT} runs at {shape}, float inputs random, integer inputs zero"]
    return Tuning(kind, 1, max_batch, False, [], 0, warmup, reasons)


def _defaults(device: str, spec: InputSpec, max_batch: int, why: str) -> Tuning:
    """The batcher's defaults (prefer the batch dim's opt and max, wait ``DEFAULT_QUEUE_DELAY_US``) when
    there is no curve to tune from on the target's device."""
    r = spec.dims[spec.batch_symbol]
    preferred = sorted({b for b in (r.opt, min(r.max, max_batch)) if b > 1})
    kind = "KIND_GPU" if device == "cuda" else "KIND_CPU"
    reasons = [f"dynamic batching with the defaults (preferred sizes {preferred}, {DEFAULT_QUEUE_DELAY_US} us queue delay, "
               f"one instance): {why}",
               f"warm-up: {WARMUP_COUNT} runs at each preferred size, float inputs random, integer inputs zero"]
    warmup = warmup_entries(spec, max_batch, preferred or [r.min])
    return Tuning(kind, 1, max_batch, True, preferred, DEFAULT_QUEUE_DELAY_US, warmup, reasons)


def tune(curve: list[dict[str, Any]], device: str, spec: InputSpec, max_batch: int, *,
         measured_on_target: bool = True) -> Tuning:
    """Derive Triton settings from ``curve`` (see the module docstring for the rules).

    ``device`` is the target's (``cpu`` or ``cuda``); ``max_batch`` is the config's
    ``max_batch_size`` (0 when the model has no batch dim Triton can use), as
    :func:`infopt.exporters.servers.triton.max_batch_size` computes it. ``measured_on_target``
    False (a GPU target timed on this CPU) keeps the batcher's defaults."""
    if device not in ("cpu", "cuda"):
        raise UsageError(f"cannot tune Triton for device {device!r}", fix='give device "cpu" or "cuda"')
    if max_batch > 0 and spec.batch_symbol is None:
        raise UsageError(f"max_batch {max_batch} given for inputs without a shared batch dim ({spec})",
                         fix="pass max_batch 0, or the spec whose inputs lead with the batch dim")
    if max_batch <= 0:
        return _untuned(device, spec, 0, "the model has no batch dim shared by every input and output "
                                         "(max_batch_size 0), so Triton cannot batch requests")
    points = _points(curve, max_batch)
    if not points:
        return _defaults(device, spec, max_batch, f"no latency was measured at any batch size from 1 to {max_batch}")
    if not measured_on_target:
        return _defaults(device, spec, max_batch, f"the curve was measured on another kind of device than the target's "
                                                  f"({device}), so it says nothing about how the target batches")
    base = points[0]
    best = max(points, key=lambda p: p["throughput"])
    floor = SATURATION_FRACTION * best["throughput"]
    knee = next(p for p in points if p["throughput"] >= floor)
    reasons = []
    if knee is base:
        preferred: list[int] = []
        delay = 0
        reasons.append(f"no preferred batch sizes: batch {base['batch']} already reaches {_rate(base['throughput'])}, "
                       f"at least {SATURATION_FRACTION:.0%} of the best ({_rate(best['throughput'])} at batch "
                       f"{best['batch']}), so bigger batches gain little")
        reasons.append("max_queue_delay 0 us: waiting for a fuller batch buys almost no throughput; requests that "
                       "queue while the instance is busy are still batched")
    else:
        preferred = sorted({knee["batch"], best["batch"]})
        start = f"batch {base['batch']}: {_rate(base['throughput'])}"
        if knee is best:
            reasons.append(f"preferred batch size {preferred}: only batch {best['batch']} reaches "
                           f"{SATURATION_FRACTION:.0%} of the best throughput, its own {_rate(best['throughput'])} "
                           f"({start}), so throughput still grows with the batch")
        else:
            reasons.append(f"preferred batch sizes {preferred}: batch {knee['batch']} is the smallest reaching "
                           f"{SATURATION_FRACTION:.0%} of the best throughput ({_rate(knee['throughput'])} of "
                           f"{_rate(best['throughput'])} at batch {best['batch']}; {start})")
        raw = QUEUE_DELAY_FRACTION * knee["p50_ms"] * 1e3
        delay = int(min(max(round(raw), MIN_QUEUE_DELAY_US), MAX_QUEUE_DELAY_US))
        clamp = "" if delay == round(raw) else f", clamped to [{MIN_QUEUE_DELAY_US}, {MAX_QUEUE_DELAY_US}] us"
        reasons.append(f"max_queue_delay {delay} us: {QUEUE_DELAY_FRACTION:g} x the p50 at batch {knee['batch']} "
                       f"({_ms(knee['p50_ms'])}){clamp}; a request waits for company at most that long, a fraction "
                       "of what running the batch costs")
    count, why = _instances(device, points, base, best)
    reasons.append(why)
    sizes = preferred or [spec.dims[spec.batch_symbol].min if spec.batch_symbol else 1]
    fills = ", ".join(f"{t.name} {'random' if t.dtype in FLOAT_DTYPES else 'zero'}" for t in spec.inputs)
    has_ints = any(t.dtype not in FLOAT_DTYPES for t in spec.inputs)
    why_zero = "; integer inputs are zero so token ids stay valid" if has_ints else ""
    reasons.append(f"warm-up: {WARMUP_COUNT} runs at each of batch {', '.join(map(str, sizes))} ({fills}{why_zero})")
    kind = "KIND_GPU" if device == "cuda" else "KIND_CPU"
    return Tuning(kind, count, max_batch, True, preferred, delay, warmup_entries(spec, max_batch, sizes), reasons)
