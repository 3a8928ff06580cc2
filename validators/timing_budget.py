"""How long a build's latency and curve steps may take: a share of what the build cost before them.

A small model's runs take milliseconds, and the recipe's settings (``latency.seconds`` per runner and
batch size, ``curve_seconds`` per point) bound its timing. A large one's take seconds: timed as a small
one is, BERT-large's latency and curve took a large part of its build (benchmarks/results/rules.md). So both steps share a
budget of ``SHARE`` of the build's time before them (validation included), at least ``FLOOR_S``:
the latency step gets ``LATENCY_PART`` of it, split evenly over its runners and batch sizes (never
more than the recipe's ``seconds``), and the curve what the latency step left. Each latency row still
takes its least runs (``MIN_LATENCY_RUNS``, two ABBA trials) however long they last, so a budget
can be overrun by those; the curve then times only the batch sizes whose predicted cost fits what is
left, and the manifest's ``timing_notes`` say which were left out, and the budget.
"""

from __future__ import annotations

from dataclasses import dataclass

SHARE = 0.2
"""latency and curve together: this share of the build's time before them (so, with validation, about a
quarter of the whole build)"""
FLOOR_S = 10.0
"""a budget is never less than this, so a quick build's rows still take about a second each (4 runners at 2
batch sizes share 7.5 s; a model running in milliseconds is timed in hundreds of runs). It was 30 s, which left
every build under 150 s timed as its recipe says: BERT-large's latency step then took 32 s of a 100 s build
(its validation 9 s more), well past the quarter of a build that validation and timing may take"""
LATENCY_PART = 0.75
"""the latency step's part of the budget; the curve gets what is left"""


@dataclass
class TimingBudget:
    seconds: float
    """latency and curve together"""
    build_s: float
    """the build's time before them, which the budget is a share of"""

    @classmethod
    def after(cls, build_s: float) -> "TimingBudget":
        return cls(max(FLOOR_S, SHARE * build_s), build_s)

    def latency_row_s(self, recipe_seconds: float, runners: int, rows: int) -> float:
        """Seconds for one runner at one batch size: its even part of the latency step's share, at most the
        recipe's."""
        return min(recipe_seconds, LATENCY_PART * self.seconds / max(1, runners * rows))

    def left_after(self, spent_s: float) -> float:
        return max(0.0, self.seconds - spent_s)

    def describe(self) -> str:
        return (f"{self.seconds:.0f} s for latency and the curve ({SHARE:.0%} of the build's {self.build_s:.0f} s "
                f"before them, at least {FLOOR_S:.0f} s)")


def predicted_seconds(batch: int, known: dict[int, float], runs: int) -> float:
    """What ``runs`` runs at ``batch`` should take, from the p50s (seconds) ``known`` at other batch sizes: the
    nearest smaller batch's time scaled by the batch (a run's cost grows at most about linearly with it),
    else the smallest larger batch's time."""
    below = [b for b in known if b <= batch]
    if below:
        b = max(below)
        return runs * known[b] * batch / b
    return runs * known[min(known)] if known else 0.0
