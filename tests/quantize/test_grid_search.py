"""Each group's grid searched for the least weighted rounding error (``quantize/grid_search.py``), and the INT4
methods that take it: RTN weighing each weight by its magnitude, GPTQ each column by its Hessian diagonal."""

from __future__ import annotations

import pytest
import torch

from infopt.quantize.gptq import Hessian, gptq_quantize
from infopt.quantize.grid_search import SEARCH_ROWS, STEPS, magnitude_weights, weighted_grid
from infopt.quantize.int4_format import fake_quantize, grid, range_grid
from infopt.quantize.int4_methods import weighted_error
from infopt.quantize.rtn import rtn_quantize
from tests.quantize.helpers import correlated_inputs


def weighted_errors(groups, importance, scale, zero, maxq=15):
    rounded = (torch.clamp(torch.round(groups / scale[:, None]) + zero[:, None], 0, maxq) - zero[:, None]) * scale[:, None]
    return (importance * (rounded - groups) ** 2).sum(1)


def heavy_tailed(rows: int, width: int, seed: int) -> torch.Tensor:
    """Groups of trained-looking weights: mostly small, a few large ones (Student's t with 4 degrees of freedom)."""
    g = torch.Generator().manual_seed(seed)
    normal = torch.randn(rows, width, generator=g)
    chi = sum(torch.randn(rows, width, generator=g) ** 2 for _ in range(4)) / 4
    return normal / chi.sqrt()


@pytest.mark.parametrize("symmetric", [False, True])
def test_the_searched_grid_rounds_no_group_worse_than_any_step_of_its_ladder_nor_min_max(symmetric):
    groups = heavy_tailed(2 * SEARCH_ROWS + 37, 64, 5)  # two chunks and a rest
    importance = torch.rand(groups.shape, generator=torch.Generator().manual_seed(6)) + 0.1
    scale, zero = weighted_grid(groups, importance, symmetric=symmetric)
    assert bool((scale > 0).all()) and bool((zero == zero.round()).all())
    assert bool(((zero >= 0) & (zero <= 15)).all())
    if symmetric:
        assert bool((zero == 8).all())
    chosen = weighted_errors(groups, importance, scale, zero)
    low, high = groups.amin(1).clamp(max=0), groups.amax(1).clamp(min=0)
    span = torch.maximum(-low, high) * 2 if symmetric else high - low
    for delta in STEPS:  # each step of the ladder, on its own plain grid
        step = span / (15 + delta)
        plain_zero = torch.full_like(step, 8) if symmetric else torch.round(-low / step).clamp(0, 15)
        assert bool((chosen <= weighted_errors(groups, importance, step, plain_zero) * (1 + 1e-4) + 1e-9).all())
    minmax = weighted_errors(groups, importance, *grid(groups, symmetric))
    assert bool((chosen <= minmax * (1 + 1e-4) + 1e-9).all())
    assert float(chosen.sum()) < 0.95 * float(minmax.sum())  # on heavy tails the range is a poor step


def test_importance_moves_the_error_to_the_weights_that_matter_less():
    groups = heavy_tailed(4096, 32, 7)
    loud = torch.ones(32)
    loud[:4] = 100.0  # four input channels whose activations are ten times the others'
    flat_scale, flat_zero = weighted_grid(groups, torch.ones(32))
    loud_scale, loud_zero = weighted_grid(groups, loud)

    def error_on(columns, scale, zero):
        return float(((fake_quantize(groups, scale, zero) - groups)[:, columns] ** 2).sum())

    assert error_on(slice(0, 4), loud_scale, loud_zero) < 0.8 * error_on(slice(0, 4), flat_scale, flat_zero)
    # and the weighted error it minimizes is lower than the unweighted grid's under the same weights
    assert float(weighted_errors(groups, loud, loud_scale, loud_zero).sum()) < \
        float(weighted_errors(groups, loud, flat_scale, flat_zero).sum())


def test_a_group_of_zeros_stays_zeros_and_the_data_free_weights_follow_the_magnitude():
    groups = torch.zeros(3, 32)
    groups[1] = torch.linspace(-1, 2, 32)
    for symmetric in (False, True):
        scale, zero = weighted_grid(groups, symmetric=symmetric)
        assert torch.equal(fake_quantize(groups[:1], scale[:1], zero[:1]), groups[:1])
    weights = magnitude_weights(groups[1:2])
    rms = float(groups[1].square().mean().sqrt())
    torch.testing.assert_close(weights[0], groups[1].abs() + rms)


@pytest.mark.parametrize("group_size", [32, 128])
def test_rtn_on_the_searched_grid_loses_less_output_than_min_max_on_heavy_tailed_weights(group_size):
    weight = heavy_tailed(128, 512, 8) * 0.02
    x = correlated_inputs(2048, 512)
    searched, plain = rtn_quantize(weight, group_size, False), rtn_quantize(weight, group_size, False, search=False)
    errors = [float(((x @ (w.effective_weight() - weight).T) ** 2).mean()) for w in (searched, plain)]
    assert errors[0] < 0.95 * errors[1]
    # the packed grid is the searched one: its scales are not the range's
    assert not torch.allclose(searched.scales, plain.scales)
    torch.testing.assert_close(searched.scales, weighted_grid(weight.reshape(-1, group_size))[0].reshape(128, -1))


@pytest.mark.parametrize("act_order", [False, True])
def test_gptq_on_the_searched_grid_loses_less_output_than_on_min_max(act_order):
    weight = heavy_tailed(96, 256, 9) * 0.02
    hessian = Hessian(256)
    hessian.add(correlated_inputs(4096, 256, seed=3))
    errors = [weighted_error(weight, gptq_quantize(weight, hessian.matrix, 64, False, act_order=act_order,
                                                   grid_search=grid_name).effective_weight(), hessian.matrix)
              for grid_name in ("search", "minmax")]
    assert errors[0] < 0.9 * errors[1]


def test_range_grid_is_the_min_max_grid():  # the ladder's first rung is min/max's own step
    groups = heavy_tailed(10, 32, 10)
    low, high = groups.amin(1), groups.amax(1)
    assert all(torch.equal(a, b) for a, b in zip(range_grid(low, high, False), grid(groups, False)))
