"""The latency-versus-batch curve of the shipped model: its latency at each power-of-two batch size of the
batch dim's range, for Triton's tuning and the report's plot, within what the build's timing budget left."""

from __future__ import annotations

import time
from typing import Any

from infopt.core import progress as progress_display
from infopt.core.recipe import MIN_CURVE_RUNS
from infopt.core.sample_inputs import id_high, random_feed
from infopt.validators import timing
from infopt.validators.timing_budget import predicted_seconds

CURVE_WARMUP = 3
CURVE_WARMUP_S = 0.2
"""The curve's warm-up: the shipped model is warm from the latency step, and one run at a new batch
size does its allocations, so it stops after 0.2 s (at least one run)."""


def curve_batches(spec) -> list[int]:
    """Powers of two from the batch dim's min to its max, and the max: the latency-versus-batch curve."""
    if spec.batch_symbol is None:
        return []
    r = spec.dims[spec.batch_symbol]
    sizes = {r.max}
    b = 1
    while b <= r.max:
        if b >= r.min:
            sizes.add(b)
        b *= 2
    return sorted(sizes)


def measure_curve(chosen, spec, module, console, timed: dict[int, Any], budget_s: float
                   ) -> tuple[list[dict[str, Any]], list[int]]:
    """Latency of the shipped model at each batch size of the curve (Triton tuning and the report's
    plot), and the batch sizes left out; the sizes the latency step ``timed`` already (same inputs, more
    runs) are taken from there. The others are timed smallest first while each one's predicted time (a
    warm-up and the least runs, scaled from the nearest smaller batch's p50) fits in ``budget_s``."""
    sizes = curve_batches(spec)
    if not sizes:
        return [], []
    high = id_high(module)
    stats = list(timed.values())
    todo = [b for b in sizes if b not in timed]
    untimed: list[int] = []
    if todo:
        status = progress_display.status(console, f"measuring the latency-versus-batch curve ({', '.join(map(str, todo))})")
        if status:
            status.start()
        try:
            lat = chosen.recipe.validation.latency
            start = time.perf_counter()
            for k, b in enumerate(todo):
                known = {s.batch: s.p50_ms / 1e3 for s in stats}
                left = budget_s - (time.perf_counter() - start)
                if predicted_seconds(b, known, 1 + MIN_CURVE_RUNS) > left:
                    untimed = todo[k:]
                    break
                feed = random_feed(spec, int_high=high, **{spec.batch_symbol: b})
                stats += timing.measure({"infopt": chosen.runner.run}, {b: feed}, warmup=CURVE_WARMUP,
                                        iterations=lat.curve_iterations, devices={"infopt": chosen.runner.device},
                                        seconds=min(lat.curve_seconds, left), min_iterations=MIN_CURVE_RUNS,
                                        min_warmup=1, warmup_s=CURVE_WARMUP_S,
                                        clocks=timing.worker_clocks(infopt=chosen.runner)).stats
        finally:
            if status:
                status.stop()
    curve = [{k: v for k, v in s.to_json().items() if k != "runner"} for s in sorted(stats, key=lambda s: s.batch)
             if s.batch in sizes]
    return curve, untimed
