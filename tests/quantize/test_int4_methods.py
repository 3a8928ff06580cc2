"""INT4 weight-only methods on synthetic layers whose inputs are built to show each method's point:
the packed format, RTN's grid, GPTQ's error compensation, AWQ's activation-aware scaling, and
the streaming driver."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from infopt.core.errors import UsageError
from infopt.quantize.awq import ActivationStatistics, awq_quantize
from infopt.quantize.gptq import Hessian, gptq_quantize
from infopt.quantize.int4_config import GPTQConfig, Int4Config
from infopt.quantize.int4_format import Int4Linear, decompose_int4, grid, pack_int4, unpack_int4
from infopt.quantize.int4_methods import handler_for, output_errors, weighted_error
from infopt.quantize.rtn import rtn_quantize
from infopt.quantize.weight_only import calibrate_int4, layer_groups, quantize_int4
from infopt.validators.metrics import cosine
from tests.quantize.helpers import correlated_inputs


def output_error(weight: torch.Tensor, quantized: torch.Tensor, x: torch.Tensor) -> float:
    return float(((x @ weight.T - x @ quantized.T) ** 2).mean())


def test_pack_layout_is_low_nibble_first_and_round_trips():
    codes = torch.randint(0, 16, (5, 12), generator=torch.Generator().manual_seed(0))
    packed = pack_int4(codes)
    assert packed.shape == (5, 6) and packed.dtype == torch.uint8
    assert int(packed[2, 3]) == int(codes[2, 6]) | (int(codes[2, 7]) << 4)
    assert torch.equal(unpack_int4(packed), codes.to(torch.uint8))


@pytest.mark.parametrize("symmetric", [False, True])
def test_rtn_on_the_min_max_grid_stays_within_half_a_step(symmetric):
    weight = torch.randn(16, 256, generator=torch.Generator().manual_seed(1))
    packed = rtn_quantize(weight, 64, symmetric, search=False)
    step = packed.scales.repeat_interleave(64, 1)
    assert packed.qweight.shape == (16, 128) and packed.scales.shape == (16, 4)
    if symmetric:
        assert bool((packed.zeros == 8).all())
        inside = weight.abs() <= 7 * step
        assert bool(((packed.dequantize() - weight).abs()[inside] <= step[inside] / 2 + 1e-6).all())
    else:
        assert float(((packed.dequantize() - weight).abs() / step).max()) <= 0.5 + 1e-4


def test_rtn_of_a_bf16_weight_rounds_what_its_float32_widening_rounds():
    weight = torch.randn(300, 512, generator=torch.Generator().manual_seed(6)).to(torch.bfloat16)
    narrow, wide = rtn_quantize(weight, 128, False), rtn_quantize(weight.float(), 128, False)
    assert torch.equal(narrow.qweight, wide.qweight) and torch.equal(narrow.scales, wide.scales)
    assert torch.equal(narrow.zeros, wide.zeros)


def test_hessian_streamed_in_batches_equals_the_whole_gram_matrix():
    x = correlated_inputs(300, 32)
    hessian = Hessian(32)
    for part in torch.split(x, [100, 57, 143]):
        hessian.add(part.reshape(1, -1, 32))
    assert hessian.rows == 300
    torch.testing.assert_close(hessian.matrix, 2 * x.T @ x / 300, rtol=1e-4, atol=1e-3)



@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_wide_layers_hessian_summed_band_by_band_below_the_diagonal_is_the_whole_gram_matrix(dtype):
    """Past ``4 * BAND`` inputs (a down projection's) only the lower triangle is summed, band by band, and the upper
    one mirrored when read: the same matrix, bit for bit in float32, and to bf16's rounding of each batch's sum."""
    features = 4 * Hessian.BAND + 300  # a last band narrower than the rest
    x = correlated_inputs(700, features).to(dtype)
    banded, whole = Hessian(features), Hessian(features)
    whole.banded = False
    assert banded.banded
    for part in torch.split(x, [450, 250]):
        banded.add(part)
        whole.add(part)
    matrix = banded.matrix
    assert torch.equal(matrix, matrix.T) and matrix.is_contiguous()
    if dtype == torch.float32:
        torch.testing.assert_close(matrix, whole.matrix, rtol=1e-5, atol=1e-5)
    else:
        assert float((matrix - whole.matrix).norm() / whole.matrix.norm()) < 2 ** -8
    assert not Hessian(4 * Hessian.BAND).banded


def test_a_bf16_models_hessian_is_the_float32_sum_of_its_activations_to_bf16_rounding(monkeypatch):
    """bf16 activations are multiplied in bf16 where the CPU has bf16 products (each batch's sum rounded once, then
    summed in fp32): the matrix stays within bf16's rounding of the exact one, and GPTQ's error under the exact matrix
    barely moves. Where bf16 is emulated, they are widened first: the exact sum."""
    from infopt.quantize import gptq

    x = correlated_inputs(4096, 256).bfloat16()
    widened = Hessian(256)
    monkeypatch.setattr(gptq, "bf16_products_fast", lambda device: False)
    for part in torch.split(x, 512):
        widened.add(part)
    monkeypatch.setattr(gptq, "bf16_products_fast", lambda device: True)
    fast, exact = Hessian(256), Hessian(256)
    for part in torch.split(x, 512):
        fast.add(part)
        exact.add(part.float())
    assert fast.rows == exact.rows == 4096 and fast.sum.dtype == torch.float32
    assert 0 < float((fast.matrix - exact.matrix).norm() / exact.matrix.norm()) < 2 ** -8
    torch.testing.assert_close(widened.matrix, exact.matrix)
    weight = torch.randn(64, 256, generator=torch.Generator().manual_seed(5)) * 0.05
    errors = [weighted_error(weight, gptq_quantize(weight, h.matrix, 64, False).effective_weight(), exact.matrix)
              for h in (fast, exact)]
    assert errors[0] == pytest.approx(errors[1], rel=0.02)


@pytest.mark.parametrize("features", [64, 1000])
def test_gptq_factor_is_the_inverse_transpose_of_the_upper_cholesky_factor_of_the_damped_inverse(features):
    """One Cholesky of the reversed matrix (by panels where it is wider than one) gives ``A`` (lower) with
    ``A^T A = H + lam I``, the inverse transpose of GPTQ's factor ``U`` (``U^T U = (H + lam I)^-1``); too few rows
    for ``H`` to factor raise the damping."""
    from infopt.quantize.gptq import _hessian_factor, _Reach

    x = correlated_inputs(4 * features, features).double()
    h = x.T @ x / x.shape[0]
    lower, lam = _hessian_factor(h.float().flip(0, 1), 0.01)  # it takes H in reversed order
    base = 0.01 * float(h.diagonal().mean())
    assert torch.allclose(lam.double(), torch.full((features,), base, dtype=torch.float64), rtol=1e-5)
    damped = h + base * torch.eye(features, dtype=torch.float64)
    a = _Reach(lower, 1).block(0, features).double()
    assert torch.equal(a, a.tril())
    assert float((a.T @ a - damped).norm() / damped.norm()) < 1e-5
    upper = torch.linalg.cholesky(torch.linalg.inv(damped), upper=True)
    assert float((a - torch.linalg.inv(upper).T).norm() / a.norm()) < 1e-3
    few = x[: features // 2]  # fewer rows than features: H is singular, and factors once damped enough
    singular = (few.T @ few / few.shape[0]).float()
    lower, lam = _hessian_factor(singular.flip(0, 1), 1e-9)
    assert float(lam.max()) > 1e-9 * float(singular.diagonal().mean()) and bool(torch.isfinite(lower).all())
    damped = singular.double().flip(0, 1) + torch.diag(lam.double())
    assert float((lower.double() @ lower.double().T - damped).norm() / damped.norm()) < 1e-5


def test_gptq_damping_is_raised_from_the_panel_that_does_not_factor_on():
    """A wide reversed Hessian whose first panel factors and whose later columns are singular: the damping is raised
    on those later columns alone, the first panel's factor is the one it had, and the factor is that of ``H + D``."""
    from infopt.quantize.gptq import PANEL, _hessian_factor

    well = correlated_inputs(4 * PANEL, PANEL).double()  # full rank
    mix = torch.randn(100, 4 * PANEL - 448, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    x = torch.cat([well, well[:, :100] @ mix], dim=1)  # more columns of rank 100, read from the first ones
    reversed_h = (x.T @ x / x.shape[0]).float()
    base = 1e-9 * float(reversed_h.diagonal().mean())
    lower, lam = _hessian_factor(reversed_h.clone(), 1e-9)
    assert torch.allclose(lam[:PANEL].double(), torch.full((PANEL,), base, dtype=torch.float64), rtol=1e-5)
    assert float(lam[PANEL:].min()) >= 9 * base and float(lam[PANEL:].max()) == float(lam[PANEL:].min())
    first = torch.linalg.cholesky(reversed_h[:PANEL, :PANEL] + base * torch.eye(PANEL))
    assert float((lower[:PANEL, :PANEL] - first).abs().max()) < 1e-4 * float(first.abs().max())
    damped = reversed_h.double() + torch.diag(lam.double())
    assert float((lower.double() @ lower.double().T - damped).norm() / damped.norm()) < 1e-5


def test_gptq_without_an_inverse_rounds_as_algorithm_1_does():
    """In float64, rounding each column at its optimal value read from ``A`` (no inverse) gives the codes of GPTQ's
    Algorithm 1 with ``H^-1``'s factor: in the weight's order, in act-order, and in whole groups by importance."""
    import infopt.quantize.gptq as gptq

    torch.set_default_dtype(torch.float64)
    try:
        features, rows = 256, 24
        x = correlated_inputs(1024, features, seed=2).double()
        h = x.T @ x / x.shape[0]
        w = torch.randn(rows, features, generator=torch.Generator().manual_seed(4), dtype=torch.float64) * 0.05
        for group, act_order, group_order in ((32, False, False), (64, True, False), (32, False, True)):
            damped = h + 0.01 * float(h.diagonal().mean()) * torch.eye(features)
            order = torch.argsort(torch.diag(h), descending=True) if act_order else torch.arange(features)
            if group_order:
                order = gptq._groups_by_importance(torch.diag(h), group)[0]
                # whole groups: each one's columns are those of one group of the weight's own order
                members = order.reshape(-1, group).div(group, rounding_mode="floor")
                assert bool((members == members[:, :1]).all()) and not torch.equal(order, torch.arange(features))
            u = torch.linalg.cholesky(torch.linalg.inv(damped[order][:, order]), upper=True)
            target, codes = w[:, order].clone(), torch.zeros(rows, features)
            for col in range(features):  # Algorithm 1, one column at a time
                if col % group == 0:
                    scale, zero = grid(target[:, col:col + group], False)
                codes[:, col] = torch.clamp(torch.round(target[:, col] / scale) + zero, 0, 15)
                err = (target[:, col] - (codes[:, col] - zero) * scale) / u[col, col]
                target[:, col:] -= err[:, None] * u[col, col:][None, :]
            packed = gptq.gptq_quantize(w, h, group, False, act_order=act_order, block_size=128,
                                        group_order=group_order, grid_search="minmax")
            got = unpack_int4(packed.qweight).to(codes.dtype)[:, order]
            assert torch.equal(got, codes)
            assert (packed.g_idx is not None) == act_order
    finally:
        torch.set_default_dtype(torch.float32)


def test_gptq_reads_its_layers_output_energy_from_the_forward_that_collected_their_hessian():
    """Layers reading one wide input (here three, as a block's query, key and value projections would): their
    shared Hessian also sums their outputs (bias taken off, padding left out) as the collecting forward gives them,
    so GPTQ's relative error needs no product of the stacked weight with ``H``. It is the figure that product
    gives; a stack of some of them has none, and a narrow input's Hessian takes no outputs."""
    from infopt.quantize.calib_forwards import _statistic_hooks

    g = torch.Generator().manual_seed(6)
    wide = 4 * Hessian.BAND + 64
    layers = nn.ModuleDict({n: nn.Linear(wide, width) for n, width in (("q", 64), ("k", 32), ("v", 32))})
    for layer in layers.values():
        nn.init.normal_(layer.bias, generator=g)
    x = correlated_inputs(2 * 40, wide, seed=7).reshape(2, 40, wide)
    mask = torch.ones(2, 40, dtype=torch.bool)
    mask[1, 25:] = False  # the second passage is padded
    stats = {n: Hessian(wide) for n in layers}
    assert stats["q"].wants_outputs and not Hessian(4 * Hessian.BAND).wants_outputs
    current = {"mask": mask}
    handles = _statistic_hooks(layers, list(layers), stats, current)
    with torch.no_grad():
        for layer in layers.values():
            layer(x)
    for handle in handles:
        handle.remove()
    hessian = stats["q"]
    assert stats["k"] is hessian and stats["v"] is hessian and hessian.rows == 65
    stacked = torch.cat([layer.weight.detach() for layer in layers.values()])
    real = x[mask]
    assert torch.allclose(hessian.matrix, 2 * real.T @ real / 65, rtol=1e-4, atol=1e-5)
    assert hessian.output_energy(128) == pytest.approx(output_errors(stacked, torch.zeros_like(stacked),
                                                                     hessian.matrix)[0], rel=1e-4)
    assert hessian.output_energy(64) is None
    config = GPTQConfig(group_size=64)
    done = handler_for(config).quantize(stacked, hessian, config)
    assert done.error == pytest.approx(output_errors(stacked, done.weight.effective_weight(), hessian.matrix)[1],
                                       rel=1e-3)


@pytest.mark.parametrize("act_order", [False, True])
def test_gptq_reports_the_output_error_of_the_weight_it_wrote(act_order):
    """GPTQ reads ``tr(E H E^T)`` from its own steps' losses (less the damping's share), not from a product with
    ``H``: it must be the figure the written weight gives, a dead input feature and act-order included."""
    weight = torch.randn(96, 256, generator=torch.Generator().manual_seed(3)) * 0.05
    x = correlated_inputs(1024, 256, seed=1)
    x[:, 7] = 0  # a feature the calibration never lit: its Hessian row is zero
    hessian = Hessian(256)
    hessian.add(x)
    config = GPTQConfig(group_size=64, act_order=act_order)
    done = handler_for(config).quantize(weight, hessian, config)
    absolute, relative = output_errors(weight, done.weight.effective_weight(), hessian.matrix)
    assert done.output_error == pytest.approx(absolute, rel=1e-4)
    assert done.error == pytest.approx(relative, rel=1e-4)
    assert 0 < relative < 0.05


@pytest.mark.parametrize("act_order", [False, True])
def test_gptq_has_less_output_error_than_rtn(act_order):
    weight = torch.randn(48, 256, generator=torch.Generator().manual_seed(2)) * 0.05
    x = correlated_inputs(2048, 256)
    hessian = Hessian(256)
    hessian.add(x)
    gptq = gptq_quantize(weight, hessian.matrix, 64, False, act_order=act_order)
    rtn = rtn_quantize(weight, 64, False)
    gptq_err = weighted_error(weight, gptq.effective_weight(), hessian.matrix)
    rtn_err = weighted_error(weight, rtn.effective_weight(), hessian.matrix)
    assert gptq_err < 0.7 * rtn_err, (gptq_err, rtn_err)
    assert output_error(weight, gptq.effective_weight(), x) < output_error(weight, rtn.effective_weight(), x)
    if act_order:
        assert gptq.g_idx is not None and gptq.g_idx.shape == (256,)
        assert torch.equal(torch.bincount(gptq.g_idx.long()), torch.full((4,), 64))
    else:
        assert gptq.g_idx is None


def test_awq_scales_loud_features_and_beats_rtn():
    g = torch.Generator().manual_seed(3)
    weight = torch.randn(64, 256, generator=g) * 0.05
    x = torch.randn(4096, 256, generator=g)
    x[:, 7::32] *= 30
    stats = ActivationStatistics(256)
    for part in torch.split(x, 512):
        stats.add(part)
    assert stats.rows == 4096 and torch.allclose(stats.mean_abs, x.abs().mean(0), rtol=1e-5)
    assert torch.allclose(stats.hessian.matrix, 2 * x.T @ x / 4096, rtol=1e-4, atol=1e-3)
    awq, alpha = awq_quantize(weight, stats, 64, False)
    rtn = rtn_quantize(weight, 64, False)
    assert alpha is not None and awq.input_scale is not None
    assert float(awq.input_scale[7::32].mean()) > float(awq.input_scale.mean())
    assert output_error(weight, awq.effective_weight(), x) < 0.8 * output_error(weight, rtn.effective_weight(), x)


@pytest.mark.parametrize("act_order", [False, True])
def test_awq_then_gptq_keeps_the_scales_rounds_under_the_scaled_hessian_and_reports_the_true_error(act_order,
                                                                                                  monkeypatch):
    """AWQ's scales, then GPTQ on the scaled weight: less output error than AWQ, GPTQ or RTN alone on inputs with
    loud features, the scale kept as the layer's input scale, and the error reported that of the weight written."""
    from infopt.quantize.int4_config import AWQConfig, AWQGPTQConfig

    g = torch.Generator().manual_seed(3)
    weight = torch.randn(64, 256, generator=g) * 0.05
    x = correlated_inputs(4096, 256, seed=4)
    x[:, 7::32] *= 30
    config = AWQGPTQConfig(group_size=64, act_order=act_order)
    handler = handler_for(config)
    statistic = handler.statistic(config, 256)
    for part in torch.split(x, 512):
        statistic.add(part)
    assert statistic.rows == 4096
    done = handler.quantize(weight, statistic, config)
    assert done.alpha is not None and done.weight.input_scale is not None
    assert float(done.weight.input_scale[7::32].mean()) > float(done.weight.input_scale.mean())
    assert (done.weight.g_idx is not None) == act_order
    absolute, relative = output_errors(weight, done.weight.effective_weight(), statistic.hessian.matrix)
    assert done.output_error == pytest.approx(absolute, rel=1e-3) and done.error == pytest.approx(relative, rel=1e-3)
    awq_config = AWQConfig(group_size=64)
    awq_stat = handler_for(awq_config).statistic(awq_config, 256)
    for part in torch.split(x, 512):
        awq_stat.add(part)
    awq = handler_for(awq_config).quantize(weight, awq_stat, awq_config)
    both = output_error(weight, done.weight.effective_weight(), x)
    assert both < 0.8 * output_error(weight, awq.weight.effective_weight(), x)
    hessian = Hessian(256)
    hessian.add(x)
    assert both < 0.8 * output_error(weight, gptq_quantize(weight, hessian.matrix, 64, False).effective_weight(), x)

    # a layer no scale helps keeps a scale of ones (its decoder's layers stay alike), and GPTQ's codes as they are
    import infopt.quantize.awq_gptq as awq_gptq

    monkeypatch.setattr(awq_gptq, "search_scale", lambda *args, **kwargs: (None, None))
    plain = handler.quantize(weight, statistic, config)
    assert plain.alpha is None and torch.equal(plain.weight.input_scale, torch.ones(256))
    alone = gptq_quantize(weight, statistic.hessian.matrix, 64, False, act_order=act_order,
                          group_order=config.group_order)
    assert torch.equal(plain.weight.qweight, alone.qweight)
    assert both < 0.5 * output_error(weight, rtn_quantize(weight, 64, False).effective_weight(), x)


class Stack(nn.Module):
    """Embedding -> blocks (a ModuleList) -> head, like a transformer's layer stack."""

    def __init__(self, dim: int = 64, blocks: int = 3):
        super().__init__()
        self.embed = nn.Embedding(50, dim)
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(), nn.Linear(2 * dim, dim))
                                    for _ in range(blocks))
        self.head = nn.Linear(dim, 8)

    def forward(self, ids):
        h = self.embed(ids)
        for block in self.blocks:
            h = h + block(h)
        return self.head(h)


def test_driver_quantizes_block_by_block_and_stops_each_forward_at_its_block():
    torch.manual_seed(0)
    model = Stack().eval()
    batches = [(torch.randint(0, 50, (4, 10)),) for _ in range(3)]
    groups = layer_groups(model, [n for n, m in model.named_modules() if isinstance(m, nn.Linear)])
    assert [members for _, members in groups] == [["blocks.0.0", "blocks.0.2"], ["blocks.1.0", "blocks.1.2"],
                                                  ["blocks.2.0", "blocks.2.2"], ["head"]]
    last_block_runs = []
    model.blocks[2].register_forward_hook(lambda *_: last_block_runs.append(1))
    with torch.no_grad():
        reference = model(batches[0][0])
    last_block_runs.clear()
    said = []
    result = calibrate_int4(model, Int4Config(method="gptq", group_size=32), batches, progress=said.append)
    # a residual between blocks: no chain (one forward shows it), so each group runs the model from its input:
    # blocks 0 and 1 stop before block 2 runs; block 2's group and the head's group run it
    assert len(last_block_runs) == 1 + 2 * len(batches)
    assert sum("collecting" in s for s in said) == 4
    layers = [s for s in said if s.startswith("layer ")]  # each layer's line, with the time left after the first
    assert len(layers) == 7 and "left" not in layers[0] and all(" s left" in s for s in layers[1:])
    assert set(result.weights) == {"blocks.0.0", "blocks.0.2", "blocks.1.0", "blocks.1.2", "blocks.2.0", "blocks.2.2", "head"}
    assert all(isinstance(m, nn.Linear) for n, m in model.named_modules() if n in result.weights)
    quantize_int4(model, Int4Config(method="gptq", group_size=32), batches)
    assert sum(isinstance(m, Int4Linear) for m in model.modules()) == 7
    with torch.no_grad():
        cos = torch.nn.functional.cosine_similarity(model(batches[0][0]).flatten(), reference.flatten(), dim=0)
    assert float(cos) > 0.99


class Chain(nn.Module):
    """Blocks that hold their residual, as a transformer's layers do: each takes the previous one's output and the
    same mask, so calibration runs each block alone on its cached inputs."""

    class Block(nn.Module):
        def __init__(self, dim: int):
            super().__init__()
            self.up, self.down = nn.Linear(dim, 2 * dim), nn.Linear(2 * dim, dim)

        def forward(self, h, mask=None):
            return h + self.down(torch.nn.functional.gelu(self.up(h))) * mask

    def __init__(self, dim: int = 64, blocks: int = 6):
        super().__init__()
        self.embed = nn.Embedding(50, dim)
        self.blocks = nn.ModuleList(self.Block(dim) for _ in range(blocks))

    def forward(self, ids):
        h, mask = self.embed(ids), (ids > 0).float().unsqueeze(-1)
        for block in self.blocks:
            h = block(h, mask=mask)
        return h


def test_calibration_runs_each_block_a_fixed_number_of_times_whatever_the_depth(monkeypatch):
    """Linear in the depth: each of 6 blocks runs once to see the chain, then per batch once for its statistics
    and once quantized for the next block's inputs; the weights are those of running the model up to each block."""
    from infopt.quantize import weight_only

    torch.manual_seed(0)
    model = Chain().eval()
    batches = [(torch.randint(0, 50, (4, 10)),) for _ in range(3)]
    runs = [0] * len(model.blocks)
    for index, block in enumerate(model.blocks):
        block.register_forward_hook(lambda *_, i=index: runs.__setitem__(i, runs[i] + 1))
    cached = calibrate_int4(model, Int4Config(method="gptq", group_size=32), batches)
    assert runs == [1 + 2 * len(batches)] * len(model.blocks)
    monkeypatch.setattr(weight_only, "chained", lambda *_: False)  # the model run up to each block instead
    runs[:] = [0] * len(model.blocks)
    forward = calibrate_int4(model, Int4Config(method="gptq", group_size=32), batches)
    assert runs[0] == len(model.blocks) * len(batches) and runs[-1] == len(batches)  # quadratic in the depth
    assert set(cached.weights) == set(forward.weights)
    for name, weight in cached.weights.items():
        assert torch.allclose(weight.scales, forward.weights[name].scales, rtol=1e-5, atol=1e-7)
        assert (weight.qweight != forward.weights[name].qweight).float().mean() < 0.01, name


def test_int4_layer_exports_as_one_op_and_decomposes_to_the_same_numbers():
    torch.manual_seed(0)
    model = Stack(blocks=1).eval()
    quantize_int4(model, Int4Config(method="rtn", group_size=32))
    ids = torch.randint(0, 50, (2, 5))
    program = torch.export.export(model, (ids,))
    ops = [n.target for n in program.graph.nodes if n.op == "call_function"]
    assert ops.count(torch.ops.infopt.int4_linear.default) == 3
    decomposed, count = decompose_int4(program)
    assert count == 3
    assert not any(n.target is torch.ops.infopt.int4_linear.default for n in decomposed.graph.nodes)
    torch.testing.assert_close(decomposed.module()(ids), model(ids))


def test_no_linear_layers_is_a_clear_error():
    conv = nn.Sequential(nn.Conv2d(1, 4, 3), nn.ReLU())
    with pytest.raises(UsageError, match="no nn.Linear layers") as info:
        quantize_int4(conv, Int4Config(method="rtn"))
    assert "Conv2d" in info.value.where and "--int8" in info.value.fix


def test_group_size_falls_back_per_layer_and_keeps_what_nothing_divides():
    model = nn.Sequential(nn.Linear(64, 96), nn.ReLU(), nn.Linear(96, 50), nn.ReLU(), nn.Linear(50, 7)).eval()
    x = torch.randn(16, 64)
    expected = model(x)
    result = quantize_int4(model, Int4Config(method="rtn", group_size=48))
    # 48 divides neither 64 nor 50; 32 (the largest of 128/64/32 below 48) divides 64 and 96; nothing divides 50
    assert {row.name: row.group_size for row in result.layers} == {"0": 32, "2": 48}
    assert list(result.kept) == ["4"] and "50 input features" in result.kept["4"]
    assert type(model[4]) is nn.Linear and type(model[0]).__name__ == "Int4Linear"
    assert cosine(expected.detach().numpy(), model(x).detach().numpy()) > 0.99


def test_gptq_without_calibration_data_says_so():
    with pytest.raises(UsageError, match="needs calibration data"):
        quantize_int4(Stack(), Int4Config(method="gptq", group_size=32), [])


def test_every_method_name_has_one_config_class_and_one_handler():
    from typing import get_args

    from infopt.quantize.int4_config import METHOD_CONFIGS, Method
    from infopt.quantize.int4_methods import HANDLERS

    assert set(get_args(Method)) == set(METHOD_CONFIGS.items) == set(HANDLERS.items) >= {"rtn", "gptq", "awq"}
    for name, handler in HANDLERS.items.items():
        assert handler.config is METHOD_CONFIGS.items[name]
        assert (handler.statistic is None) == (not handler.config.needs_data)


def test_the_flat_config_names_its_method_and_refuses_another_methods_setting():
    from infopt.quantize.int4_config import AWQConfig, GPTQConfig, RTNConfig

    assert Int4Config(method="gptq", act_order=True, group_size=64).method_config() == GPTQConfig(act_order=True, group_size=64)
    assert Int4Config(method="awq", awq_grid=5).method_config() == AWQConfig(awq_grid=5)
    assert Int4Config(method="rtn", symmetric=True).method_config() == RTNConfig(symmetric=True)
    with pytest.raises(UsageError, match="awq_grid is a setting of AWQ"):
        Int4Config(method="gptq", awq_grid=5).method_config()


def test_each_method_keeps_its_own_column_order_unless_one_is_given():
    """GPTQ takes whole groups by importance; AWQ-GPTQ the weight's own order, which lost less on the real SmolLM2."""
    assert Int4Config(method="gptq").method_config().group_order is True
    assert Int4Config(method="awq-gptq").method_config().group_order is False
    assert Int4Config(method="awq-gptq", group_order=True).method_config().group_order is True
    assert Int4Config(method="gptq", group_order=False).method_config().group_order is False


def test_a_method_registered_from_one_module_is_used_by_the_driver(monkeypatch):
    """A new method is a config class and a handler: the driver collects its statistic and calls it."""
    from typing import ClassVar

    from infopt.quantize.int4_config import METHOD_CONFIGS, Int4MethodConfig
    from infopt.quantize.int4_methods import HANDLERS, Int4Method, Quantized

    class MaxAbsConfig(Int4MethodConfig):
        name: ClassVar[str] = "maxabs"

    class MaxAbs:
        """Tracks the largest |x| per input feature; the weight is rounded symmetrically."""

        def __init__(self, features):
            self.peak, self.rows = torch.zeros(features), 0

        def add(self, x):
            self.peak = torch.maximum(self.peak, x.detach().abs().reshape(-1, x.shape[-1]).amax(0).cpu())
            self.rows += x.reshape(-1, x.shape[-1]).shape[0]

    seen = {}

    def quantize(weight, statistic, config):
        seen[weight.shape] = statistic.rows
        return Quantized(rtn_quantize(weight, config.group_size, True), 0.0)

    monkeypatch.setitem(METHOD_CONFIGS.items, "maxabs", MaxAbsConfig)
    monkeypatch.setitem(HANDLERS.items, "maxabs", Int4Method(MaxAbsConfig, quantize, lambda c, k: MaxAbs(k)))
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 16)).eval()
    batches = [(torch.randn(8, 32),) for _ in range(3)]
    result = calibrate_int4(model, MaxAbsConfig(group_size=32), batches)
    assert seen == {(64, 32): 24, (16, 64): 24}
    assert sorted(result.weights) == ["0", "2"] and all(w.symmetric for w in result.weights.values())
    assert isinstance(model[0], nn.Linear), "not in place: the caller's model is unchanged"


def test_a_transformers_decoder_calibrates_block_by_block_to_the_same_weights(monkeypatch):
    """A Llama's layers form a chain (their KV cache dropped: a layer run twice on one cache would attend to its
    own first run), so GPTQ runs each alone, and rounds every weight exactly as running the model up to it does."""
    transformers = pytest.importorskip("transformers")
    from infopt.quantize import weight_only

    torch.manual_seed(0)
    lm = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=512, hidden_size=128, intermediate_size=384, num_hidden_layers=3, num_attention_heads=4,
        num_key_value_heads=2)).eval()
    batches = [(torch.randint(1, 512, (2, 32)), torch.ones(2, 32, dtype=torch.long)) for _ in range(2)]
    assert weight_only.chained(lm, list(lm.model.layers), batches[0])
    cached = calibrate_int4(lm, Int4Config(method="gptq", group_size=32), batches)
    monkeypatch.setattr(weight_only, "chained", lambda *_: False)
    forward = calibrate_int4(lm, Int4Config(method="gptq", group_size=32), batches)
    assert len(cached.weights) == 21
    assert all(torch.equal(w.qweight, forward.weights[n].qweight) for n, w in cached.weights.items())


def test_gptq_rounds_layers_reading_one_input_as_one_stacked_weight_to_the_same_codes():
    """A Llama block's query, key and value read one normalized input, as do its gate and up: GPTQ folds that input
    into one Hessian and rounds their rows stacked, which are the codes each layer gets on its own under it."""
    transformers = pytest.importorskip("transformers")

    torch.manual_seed(0)
    lm = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=4,
        num_key_value_heads=2)).eval()
    batches = [(torch.randint(1, 256, (2, 16)), torch.ones(2, 16, dtype=torch.long)) for _ in range(2)]
    result = calibrate_int4(lm, Int4Config(method="gptq", group_size=32), batches)
    attention = [f"model.layers.0.self_attn.{p}_proj" for p in "qkv"]
    assert len({result.layers[i].error for i in range(3)}) == 1  # one stack, one figure
    hessian = Hessian(64)
    captured = []
    handle = lm.model.layers[0].self_attn.q_proj.register_forward_pre_hook(lambda _m, args: captured.append(args[0]))
    with torch.no_grad():
        for ids, mask in batches:
            lm(input_ids=ids, attention_mask=mask)
    handle.remove()
    for x in captured:
        hessian.add(x)
    for name in attention:
        alone = gptq_quantize(lm.get_submodule(name).weight.detach(), hessian.matrix, 32, False)
        assert (alone.qweight != result.weights[name].qweight).float().mean() < 0.001, name


def test_padded_positions_stay_out_of_the_statistics():
    """Passages of several lengths batched together: the padding the mask marks adds nothing to the Hessian, so
    GPTQ on one padded batch rounds as on the passages run one by one."""
    transformers = pytest.importorskip("transformers")

    torch.manual_seed(0)
    lm = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2)).eval()
    lengths = (16, 11, 7)
    passages = [torch.randint(1, 256, (1, n)) for n in lengths]
    alone = calibrate_int4(lm, Int4Config(method="gptq", group_size=32),
                           [(p, torch.ones_like(p)) for p in passages])
    ids = torch.zeros(3, 16, dtype=torch.long)
    mask = torch.zeros(3, 16, dtype=torch.long)
    for row, p in enumerate(passages):
        ids[row, :p.shape[1]], mask[row, :p.shape[1]] = p[0], 1
    together = calibrate_int4(lm, Int4Config(method="gptq", group_size=32), [(ids, mask)], masks=[mask.bool()])
    unmasked = calibrate_int4(lm, Int4Config(method="gptq", group_size=32), [(ids, mask)])
    assert alone.rows == together.rows == sum(lengths) and unmasked.rows == 3 * 16
    for name, weight in alone.weights.items():
        assert (weight.qweight != together.weights[name].qweight).float().mean() < 0.002, name
    assert any((w.qweight != unmasked.weights[n].qweight).float().mean() > 0.01 for n, w in alone.weights.items())


def test_int8_share_keeps_the_layers_adding_the_most_output_error_in_float_within_the_share():
    transformers = pytest.importorskip("transformers")

    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
                                      num_attention_heads=4, num_key_value_heads=2)
    lm = transformers.LlamaForCausalLM(config).eval()
    batches = [(torch.randint(1, 256, (2, 16)), torch.ones(2, 16, dtype=torch.long)) for _ in range(2)]
    every = calibrate_int4(lm, Int4Config(method="gptq", group_size=32), batches)
    assert all(row.output_error is not None and row.output_error > 0 for row in every.layers)
    worst = max(every.layers, key=lambda row: row.output_error)
    total = sum(lm.get_submodule(row.name).weight.numel() for row in every.layers)
    result = quantize_int4(lm, Int4Config(method="gptq", group_size=32), batches, int8_share=0.3)
    kept = [name for name, why in result.kept.items() if why.startswith("kept for 8 bits")]
    floats = {n for n, m in lm.named_modules() if isinstance(m, nn.Linear) and n != "lm_head"}
    assert worst.name in kept and set(kept) == floats
    assert 0 < sum(lm.get_submodule(n).weight.numel() for n in kept) <= 0.3 * total
    assert sum(isinstance(m, Int4Linear) for m in lm.modules()) == len(every.layers) - len(kept) == len(result.layers)


@pytest.mark.parametrize("seed", range(6))
def test_awq_scale_search_finds_the_grids_best_alpha(seed):
    """The coarse-then-fine search returns the alpha a walk over the whole grid finds (least ``tr(D H D^T)``, the
    smallest alpha on a tie, no scale where none beats plain rounding), on layers with a few loud input features."""
    from infopt.quantize import awq

    torch.manual_seed(seed)
    x = correlated_inputs(512, 256, seed) * (1 + 30 * (torch.rand(256) > 0.97))
    stats = ActivationStatistics(256)
    stats.add(x)
    weight = torch.randn(96, 256) * 0.05
    scale, alpha = awq.search_scale(weight, stats.mean_abs, stats.hessian.matrix, 64, False)
    gram = stats.hessian.matrix.bfloat16()
    mean_abs = stats.mean_abs.clamp(min=1e-4)
    grouped = weight.abs().reshape(96, 4, 64)
    magnitude = (grouped / grouped.amax(-1, keepdim=True).clamp(min=1e-8)).reshape(96, 256).mean(0)

    def error(s):
        diff = awq._rounding_error(weight, s, 64, False, torch.empty_like(weight))
        return float(torch.dot((diff.bfloat16() @ gram).float().view(-1), diff.view(-1)))

    best, best_alpha = error(None), None
    for step in range(20):
        s = (mean_abs.pow(step / 20) / (magnitude.pow(1 - step / 20) + 1e-4)).clamp(min=1e-4)
        found = error(s / (s.max() * s.min()).sqrt())
        if found < best:
            best, best_alpha = found, step / 20
    assert alpha == best_alpha and (scale is None) == (best_alpha is None)
