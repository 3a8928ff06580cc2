"""The build's timing budget: latency and the curve take a share of the build, and the curve leaves out
the batch sizes whose predicted time does not fit."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest
import torch

from infopt.core.inputspec import InputSpec
from infopt.core.recipe import MIN_CURVE_RUNS, LatencyConfig
from infopt.runtime.runner import TorchRunner
from infopt.validators.timing_budget import FLOOR_S, LATENCY_PART, SHARE, TimingBudget, predicted_seconds


def test_the_budget_is_a_share_of_the_build_with_a_floor_and_the_recipe_caps_each_row():
    quick, slow = TimingBudget.after(3.0), TimingBudget.after(600.0)
    assert quick.seconds == FLOOR_S and slow.seconds == pytest.approx(SHARE * 600)
    assert quick.latency_row_s(2.0, runners=1, rows=2) == 2.0  # a quick build with one runner: as its recipe says
    assert quick.latency_row_s(2.0, runners=4, rows=2) == pytest.approx(LATENCY_PART * FLOOR_S / 8)
    assert slow.latency_row_s(2.0, runners=4, rows=2) == 2.0  # the recipe's seconds stay the most a row takes
    assert slow.latency_row_s(60.0, runners=4, rows=2) == pytest.approx(LATENCY_PART * 120 / 8)
    assert slow.left_after(100.0) == pytest.approx(20.0) and slow.left_after(500.0) == 0.0
    assert "120 s for latency and the curve (20% of the build's 600 s" in slow.describe()


def test_a_run_is_predicted_from_the_nearest_smaller_batch_scaled_by_the_batch():
    known = {1: 0.5, 8: 3.0}
    assert predicted_seconds(16, known, runs=4) == pytest.approx(4 * 3.0 * 2)
    assert predicted_seconds(4, known, runs=2) == pytest.approx(2 * 0.5 * 4)
    assert predicted_seconds(8, {16: 1.0}, runs=1) == 1.0  # nothing smaller: the smallest larger one's time
    assert predicted_seconds(8, {}, runs=3) == 0.0


class BatchTimed(torch.nn.Module):
    """A model whose run takes 10 ms per sample: its cost grows with the batch as a large model's does."""

    def forward(self, x):
        time.sleep(0.01 * x.shape[0])
        return x * 2


def test_the_curve_times_what_fits_smallest_first_and_names_what_it_left_out():
    from infopt.api.curve import measure_curve
    from infopt.validators.timing import summarize

    spec = InputSpec.parse(["x:float32[batch,4]"], ["batch=1:8:32"])
    runner = TorchRunner(BatchTimed(), ["x"], ["y"])
    latency = LatencyConfig(curve_seconds=0.2)
    chosen = SimpleNamespace(runner=runner, recipe=SimpleNamespace(validation=SimpleNamespace(latency=latency)))
    timed = {1: summarize("infopt", 1, [0.01] * 4), 8: summarize("infopt", 8, [0.08] * 4)}
    # batch 2 and 4 fit (predicted 0.08 s and 0.16 s, warm-up included); batch 16 would take 1.28 s
    curve, untimed = measure_curve(chosen, spec, BatchTimed(), None, timed, budget_s=1.0)
    assert [p["batch"] for p in curve] == [1, 2, 4, 8] and untimed == [16, 32]
    measured = {p["batch"]: p for p in curve}
    assert measured[4]["p50_ms"] >= 40.0 and measured[4]["iterations"] >= MIN_CURVE_RUNS

    curve, untimed = measure_curve(chosen, spec, BatchTimed(), None, timed, budget_s=100.0)
    assert [p["batch"] for p in curve] == [1, 2, 4, 8, 16, 32] and untimed == []
