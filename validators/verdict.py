"""The verdict: measured figures checked against thresholds, with a reason for each miss."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from infopt.core.recipe import Validation

CHECKS = (
    # (threshold field, measured key, kind)
    ("max_abs", "max_abs", "max"),
    ("mean_abs", "mean_abs", "max"),
    ("max_rel", "max_rel", "max"),
    ("min_cosine", "cosine_min", "min"),
    ("min_mean_cosine", "cosine_mean", "min"),
    ("min_sqnr_db", "sqnr_db", "min"),
    ("min_top1", "top1", "min"),
)


@dataclass
class Check:
    name: str
    measured: float | None
    limit: float
    passed: bool

    @property
    def rule(self) -> str:
        op = "<=" if self.name in ("max_abs", "mean_abs", "max_rel", "max_p99_ms") else ">="
        return f"{op} {self.limit:g}"

    def describe(self) -> str:
        got = "not measured" if self.measured is None else f"{self.measured:.6g}"
        return f"{self.name}: {got} (limit {self.rule})"


@dataclass
class Verdict:
    passed: bool
    checks: list[Check] = field(default_factory=list)

    @property
    def reasons(self) -> list[str]:
        return [c.describe() for c in self.checks if not c.passed]

    def to_json(self) -> dict[str, Any]:
        return {"passed": self.passed, "reasons": self.reasons, "checks": [asdict(c) for c in self.checks]}


def judge(validation: Validation, drift_worst: dict[str, float | None], p99_ms: list[float]) -> Verdict:
    checks = []
    for field_name, key, kind in CHECKS:
        limit = getattr(validation.drift, field_name)
        if limit is None:
            continue
        measured = drift_worst.get(key)
        if measured is None:
            ok = field_name == "min_top1"  # top-1 applies only to classifier-shaped outputs
        else:
            ok = measured <= limit if kind == "max" else measured >= limit
        checks.append(Check(field_name, measured, limit, ok))
    limit = validation.latency.max_p99_ms
    if limit is not None:
        worst = max(p99_ms) if p99_ms else None
        checks.append(Check("max_p99_ms", worst, limit, worst is not None and worst <= limit))
    return Verdict(all(c.passed for c in checks), checks)
