"""AWQ: activation-aware per-input-feature scaling and clipping before group-wise INT4 rounding.

Lin, Tang, Tang, Yang, Chen, Wang, Xiao, Dang, Gan, Han, "AWQ: Activation-aware Weight
Quantization for LLM Compression and Acceleration", MLSys 2024 (arXiv:2306.00978).

Scale search (Sec. 3.2): input features with large activations matter most, so the weight's
columns are scaled up by ``s = mean|x|^alpha / mean_w^(1 - alpha)`` before rounding and the
input is divided by ``s``: ``Q(W diag(s)) (x / s)``. ``mean_w`` is each input feature's mean
``|w|`` relative to its group's largest (the reference implementation's "duo scaling").
``alpha`` is searched on a grid over [0, 1) to minimize the layer's output error
``||x W^T - (x / s) Q(W diag(s))^T||^2`` on calibration rows, the candidates compared through
bf16 products; plain rounding (no ``s``) stays when nothing beats it. Clip search (the reference
code's ``auto_clip``): per output row and group, the grid's range is shrunk to ``r * max|w|`` for ``r`` in (0.5, 1] when that lowers the
group's share of the output error.

:class:`ActivationSample` streams the statistics: the mean ``|x|`` per feature over every row
seen and a bounded reservoir of rows for the searches, never all activations. The scale is kept
as the layer's ``input_scale`` (the model divides by it before the layer); folding it into the
layer before is not done here.
"""

from __future__ import annotations

import torch

from infopt.quantize.int4_config import AWQConfig
from infopt.quantize.int4_format import Int4Weight, fake_quantize, grid
from infopt.quantize.int4_methods import Int4Method, Quantized, output_errors, register
from infopt.quantize.rtn import group_codes, group_grid


class ActivationSample:
    """Mean ``|x|`` per input feature over all rows, and up to ``max_rows`` rows kept at random."""

    def __init__(self, in_features: int, max_rows: int = 2048, seed: int = 0):
        self.abs_sum = torch.zeros(in_features, dtype=torch.float64)
        self.rows = 0
        self.max_rows = max_rows
        self.kept: list[torch.Tensor] = []
        self.generator = torch.Generator().manual_seed(seed)

    def add(self, inputs: torch.Tensor) -> None:
        x = inputs.detach().reshape(-1, inputs.shape[-1]).float()
        if self.abs_sum.device != x.device:
            self.abs_sum = self.abs_sum.to(x.device)
        self.abs_sum += x.abs().sum(0, dtype=torch.float64)
        self.rows += x.shape[0]
        self.kept.append(x[torch.randperm(x.shape[0], generator=self.generator)[: self.max_rows].to(x.device)])
        pool = torch.cat(self.kept)
        if pool.shape[0] > self.max_rows:
            pool = pool[torch.randperm(pool.shape[0], generator=self.generator)[: self.max_rows].to(x.device)]
        self.kept = [pool]

    @property
    def mean_abs(self) -> torch.Tensor:
        return (self.abs_sum / max(self.rows, 1)).float()

    @property
    def sample(self) -> torch.Tensor:
        return torch.cat(self.kept) if self.kept else torch.zeros(0, self.abs_sum.shape[0])


def _fake_quant(weight: torch.Tensor, group_size: int, symmetric: bool) -> torch.Tensor:
    """``weight`` rounded to its RTN group grid and back."""
    scales, zeros = group_grid(weight, group_size, symmetric)
    return fake_quantize(weight, scales.repeat_interleave(group_size, 1), zeros.repeat_interleave(group_size, 1))


def search_scale(weight: torch.Tensor, stats: ActivationSample, group_size: int, symmetric: bool,
                 grid_points: int = 20) -> tuple[torch.Tensor | None, float | None]:
    """The ``s`` with the least output error on the sampled rows and its ``alpha``; ``(None, None)``
    when no scaling beats plain rounding. The error ``||x D^T||^2`` (``D`` the rounded weight less the
    weight) is taken as ``tr(D (x^T x) D^T)``: one ``[K, K]`` product of the rows, not the rows again for
    every point of the grid."""
    x = stats.sample
    # the candidates' errors through bf16 products (the sum of each row of products in fp32): on the real SmolLM2's
    # layers the same alpha as in fp32 at half the search's time (benchmarks/results/real_llm.md)
    gram = (x.T @ x).bfloat16()
    mean_abs = stats.mean_abs.clamp(min=1e-4)
    rows, cols = weight.shape
    grouped = weight.abs().reshape(rows, cols // group_size, group_size)
    weight_mag = (grouped / grouped.amax(-1, keepdim=True).clamp(min=1e-8)).reshape(rows, cols).mean(0)

    def error(s: torch.Tensor | None) -> float:
        if s is None:
            diff = _fake_quant(weight, group_size, symmetric) - weight
        else:
            diff = _fake_quant(weight * s[None, :], group_size, symmetric) / s[None, :] - weight
        return float(torch.mul((diff.bfloat16() @ gram).float(), diff).sum())

    best, best_alpha, best_scale = error(None), None, None
    for step in range(grid_points):
        alpha = step / grid_points
        s = (mean_abs.pow(alpha) / (weight_mag.pow(1 - alpha) + 1e-4)).clamp(min=1e-4)
        s = s / (s.max() * s.min()).sqrt()
        found = error(s)
        if found < best:
            best, best_alpha, best_scale = found, alpha, s
    return best_scale, best_alpha


def search_clip(weight: torch.Tensor, x: torch.Tensor, group_size: int, symmetric: bool,
                ratios: int = 20, max_rows: int = 512) -> torch.Tensor:
    """Per output row and group, the shrink ratio ``r`` of the grid's range with the least error
    of that group's contribution to the output on ``x`` (``[N, K // g]``, values in (0.5, 1]). Each group's
    error ``||x_g d_g^T||^2`` is taken as ``d_g (x_g^T x_g) d_g^T``, through the group's ``[g, g]`` product of the
    rows."""
    rows, cols = weight.shape
    groups = cols // group_size
    by_group = x[:max_rows].reshape(-1, groups, group_size).transpose(0, 1)  # [G, rows, g]
    gram = by_group.transpose(1, 2) @ by_group  # [G, g, g]
    w = weight.reshape(rows, groups, group_size)
    best_err = torch.full((rows, groups), float("inf"), device=weight.device)
    best_ratio = torch.ones(rows, groups, device=weight.device)
    lo, hi = w.amin(-1, keepdim=True), w.amax(-1, keepdim=True)
    for step in range(ratios):
        r = 1.0 - step * 0.5 / ratios
        clipped = torch.clamp(w, lo * r, hi * r)
        scale, zero = grid(clipped.reshape(-1, group_size), symmetric)
        quantized = fake_quantize(w.reshape(-1, group_size), scale, zero).reshape(rows, groups, group_size)
        diff = (quantized - w).transpose(0, 1)  # [G, N, g]
        err = torch.mul(torch.bmm(diff, gram), diff).sum(-1).T
        better = err < best_err
        best_err = torch.where(better, err, best_err)
        best_ratio = torch.where(better, torch.full_like(best_ratio, r), best_ratio)
    return best_ratio


def awq_quantize(weight: torch.Tensor, stats: ActivationSample, group_size: int, symmetric: bool, *,
                 grid_points: int = 20, clip: bool = True) -> tuple[Int4Weight, float | None]:
    """AWQ of ``weight`` ``[N, K]``: scale search, then clip search, then rounding on the clipped
    grid. Returns the weight and the ``alpha`` chosen (None: no scale)."""
    weight = weight.detach().float()
    scale, alpha = search_scale(weight, stats, group_size, symmetric, grid_points)
    scaled = weight * scale[None, :] if scale is not None else weight
    x = stats.sample / scale[None, :] if scale is not None else stats.sample
    rows, cols = scaled.shape
    if clip:
        ratio = search_clip(scaled, x, group_size, symmetric)[..., None]
        grouped = scaled.reshape(rows, cols // group_size, group_size)
        clipped = torch.clamp(grouped, grouped.amin(-1, keepdim=True) * ratio, grouped.amax(-1, keepdim=True) * ratio)
        scales, zeros = group_grid(clipped.reshape(rows, cols), group_size, symmetric)
    else:
        scales, zeros = group_grid(scaled, group_size, symmetric)
    codes = group_codes(scaled, scales, zeros, group_size)
    return Int4Weight.from_codes(codes.cpu(), scales.cpu(), zeros.cpu(), group_size, symmetric,
                                 input_scale=None if scale is None else scale.cpu()), alpha


def _quantize(weight: torch.Tensor, stats: ActivationSample, config: AWQConfig) -> Quantized:
    packed, alpha = awq_quantize(weight, stats, config.group_size, config.symmetric,
                                 grid_points=config.awq_grid, clip=config.awq_clip)
    x = stats.sample.cpu()
    absolute, relative = output_errors(weight.cpu(), packed.effective_weight(), (x.T @ x) / max(x.shape[0], 1))
    return Quantized(packed, relative, alpha, output_error=absolute)


HANDLER = register(Int4Method(AWQConfig, _quantize,
                              lambda config, in_features: ActivationSample(in_features, max_rows=config.awq_rows)))
