"""Where a build's time went: seconds per step, in the order the steps ran.

The steps are the build's own (load, validation, latency, curve, emit...) and each pass a candidate
ran (capture, onnx_export, quantize_int8, aoti_compile...), named with the candidate. A pass that
several candidates share runs once and is listed once, under the first. The manifest records them
(``timings``), the report and ``--json`` show them, and the CLI prints :func:`summary`.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Iterator


@dataclass
class StepTimes:
    started: float = field(default_factory=time.perf_counter)
    steps: list[dict[str, Any]] = field(default_factory=list)

    def add(self, name: str, seconds: float, of: str | None = None) -> None:
        self.steps.append({"step": name, "seconds": round(seconds, 3), **({"of": of} if of else {})})

    @contextmanager
    def step(self, name: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.add(name, time.perf_counter() - start)

    def seconds(self, name: str) -> float:
        """Seconds the steps named ``name`` took so far, together."""
        return sum(s["seconds"] for s in self.steps if s["step"] == name)

    def elapsed(self) -> float:
        """Seconds since the build started."""
        return time.perf_counter() - self.started

    def to_json(self) -> dict[str, Any]:
        return {"total_s": round(time.perf_counter() - self.started, 3), "steps": list(self.steps)}


def summary(timings: dict[str, Any], most: int = 6) -> str:
    """One line: the total and the longest steps, longest first (``build took 28.1 s: aoti_compile 13.2 s, ...``)."""
    steps = sorted(timings.get("steps", []), key=lambda s: -s["seconds"])
    shown = [f"{s['step']} {s['seconds']:.1f} s" for s in steps[:most] if s["seconds"] >= 0.05]
    rest = sum(s["seconds"] for s in steps[most:])
    if rest >= 0.05:
        shown.append(f"{len(steps) - most} more {rest:.1f} s")
    return f"build took {timings['total_s']:.1f} s" + (": " + ", ".join(shown) if shown else "")
