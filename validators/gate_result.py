"""What the release gate found: one ``GateCheck`` per figure, and the ``GateResult`` over them."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class GateCheck:
    group: str
    name: str
    candidate: float | None
    baseline: float | None
    limit: str
    """the rule as text (``<= 1.1``), or ``not gated``"""
    passed: bool | None
    """None for a figure that is reported but not gated"""
    detail: str = ""
    skipped: bool = False
    """a check that should have run and could not (JUnit ``<skipped>``): accuracy with nothing to judge it by"""

    def describe(self) -> str:
        got = "-" if self.candidate is None else f"{self.candidate:.6g}"
        base = "" if self.baseline is None else f" (baseline {self.baseline:.6g})"
        return f"{self.group} {self.name}: {got}{base}, limit {self.limit}" + (f"; {self.detail}" if self.detail else "")



@dataclass
class GateResult:
    candidate: dict[str, Any]
    baseline: dict[str, Any]
    checks: list[GateCheck] = field(default_factory=list)
    measurements: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return all(c.passed is not False for c in self.checks)

    @property
    def reasons(self) -> list[str]:
        return [c.describe() for c in self.checks if c.passed is False]

    def to_json(self) -> dict[str, Any]:
        return {"passed": self.passed, "reasons": self.reasons, "candidate": self.candidate, "baseline": self.baseline,
                "checks": [asdict(c) for c in self.checks], "measurements": self.measurements, "notes": self.notes}
