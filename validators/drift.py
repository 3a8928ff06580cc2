"""Drift: run the reference and the candidate on the same inputs and compare every output."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from infopt.core.errors import ValidationFailed
from infopt.validators import metrics

WORST = {"max_abs": max, "mean_abs": max, "max_rel": max, "cosine_min": min, "cosine_mean": min,
         "sqnr_db": min, "top1": min}
"""How per-output figures combine into one: the worst of them."""


@dataclass
class DriftReport:
    samples: int
    source: str
    """Where the inputs came from: a path, or ``random`` (the fallback, flagged in the report)."""
    outputs: dict[str, dict[str, float | None]] = field(default_factory=dict)

    @property
    def worst(self) -> dict[str, float | None]:
        return worst(list(self.outputs.values()))

    @property
    def random_inputs(self) -> bool:
        return self.source == "random"

    def to_json(self) -> dict[str, Any]:
        return {"samples": self.samples, "source": self.source, "random_inputs": self.random_inputs,
                "worst": self.worst, "outputs": self.outputs}


def worst(per_output: list[dict[str, float | None]]) -> dict[str, float | None]:
    """The worst of each figure over several outputs' metrics."""
    combined: dict[str, float | None] = {}
    for key, pick in WORST.items():
        values = [o[key] for o in per_output if o.get(key) is not None]
        combined[key] = pick(values) if values else None
    return combined


def compare(reference_outputs: list[list[np.ndarray]], candidate_outputs: list[list[np.ndarray]],
            output_names: tuple[str, ...], source: str) -> DriftReport:
    """Metrics per output over all batches (concatenated along the batch axis)."""
    if not reference_outputs:
        raise ValidationFailed("no validation samples were run", fix="pass --val with at least one sample")
    counts = {len(r) for r in reference_outputs} | {len(c) for c in candidate_outputs}
    if len(counts) != 1:
        raise ValidationFailed(f"the candidate returns a different number of outputs than the reference ({sorted(counts)})")
    n_out = counts.pop()
    names = output_names if len(output_names) == n_out else tuple(f"output_{i}" for i in range(n_out))
    report = DriftReport(samples=0, source=source)
    for i, name in enumerate(names):
        ref = _concat([r[i] for r in reference_outputs])
        cand = _concat([c[i] for c in candidate_outputs])
        if ref.shape != cand.shape:
            raise ValidationFailed(f"output {name}: the candidate's shape {list(cand.shape)} "
                                   f"differs from the reference's {list(ref.shape)}")
        report.outputs[name] = metrics.drift(ref, cand)
        report.samples = int(ref.shape[0]) if ref.ndim else 1
    return report


def _concat(arrays: list[np.ndarray]) -> np.ndarray:
    arrays = [np.asarray(a) for a in arrays]
    if len(arrays) == 1 or arrays[0].ndim == 0:
        return arrays[0] if len(arrays) == 1 else np.stack(arrays)
    return np.concatenate(arrays, axis=0)
