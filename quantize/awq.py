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

:class:`ActivationStatistics` streams what the searches need over every calibration row: the mean ``|x|`` per
feature and the layer's Hessian ``X^T X`` (GPTQ's, summed through bf16 products for a bf16 model). Each error is a
trace under it, ``tr(D H D^T)``, so no rows are kept and each layer's searches see all of them. The scale is kept as
the layer's ``input_scale`` (the model divides by it before the layer): one per layer, so it is not folded into the
norm before (``scale_folding.py`` folds a scale the layers reading one input share).
"""

from __future__ import annotations

import torch

from infopt.quantize.gptq import Hessian
from infopt.quantize.int4_config import AWQConfig
from infopt.quantize.int4_format import MAXQ, Int4Weight, range_grid
from infopt.quantize.int4_methods import Int4Method, Quantized, output_errors, product_dtype, register
from infopt.quantize.rtn import group_codes, group_grid


class ActivationStatistics:
    """Mean ``|x|`` per input feature and the Hessian ``2 X^T X / n`` over every row a layer sees."""

    def __init__(self, in_features: int):
        self.abs_sum = torch.zeros(in_features, dtype=torch.float64)
        self.hessian = Hessian(in_features)

    @property
    def rows(self) -> int:
        return self.hessian.rows

    def add(self, inputs: torch.Tensor) -> None:
        x = inputs.detach().reshape(-1, inputs.shape[-1])
        if self.abs_sum.device != x.device:
            self.abs_sum = self.abs_sum.to(x.device)
        self.abs_sum += x.abs().sum(0, dtype=torch.float64)
        self.hessian.add(x)

    @property
    def mean_abs(self) -> torch.Tensor:
        return (self.abs_sum / max(self.rows, 1)).float()


def scaled_hessian(hessian: torch.Tensor, s: torch.Tensor | None) -> torch.Tensor:
    """The Hessian of the inputs divided by ``s``: ``diag(1/s) H diag(1/s)``."""
    if s is None:
        return hessian
    s = s.to(hessian.device)
    return hessian / s[:, None] / s[None, :]


def ones_if_none(scale: torch.Tensor | None, in_features: int) -> torch.Tensor:
    """The input scale a layer keeps: its own, or ones where no scale helped. Every layer then has one, so the
    decoder's layers stay alike and one is captured for all (a single layer without one made the real SmolLM2's
    capture and export several times longer: benchmarks/results/real_llm.md)."""
    return torch.ones(in_features) if scale is None else scale.float().cpu().contiguous()


def _rounding_error(weight: torch.Tensor, s: torch.Tensor | None, group_size: int, symmetric: bool,
                    out: torch.Tensor) -> torch.Tensor:
    """``Q(W diag(s)) diag(1/s) - W`` into ``out`` (``W`` without ``s``): the weight scaled, rounded to its RTN group
    grid and back, less the weight. Each step runs in place on ``out``, so a candidate costs a few passes over one
    buffer and no copies of the grid per element."""
    rows, cols = weight.shape
    scaled = (torch.mul(weight, s, out=out) if s is not None else out.copy_(weight)).view(rows, cols // group_size,
                                                                                            group_size)
    scale, zero = range_grid(scaled.amin(-1, keepdim=True), scaled.amax(-1, keepdim=True), symmetric)
    scaled.div_(scale).round_().add_(zero).clamp_(0, MAXQ).sub_(zero).mul_(scale)
    if s is not None:
        out.div_(s)
    return out.sub_(weight)


COARSE_STRIDE, COARSE_REACH = 4, 3


def search_scale(weight: torch.Tensor, mean_abs: torch.Tensor, hessian: torch.Tensor, group_size: int,
                 symmetric: bool, grid_points: int = 20) -> tuple[torch.Tensor | None, float | None]:
    """The ``s`` with the least output error on the calibration rows and its ``alpha``; ``(None, None)``
    when no scaling beats plain rounding. ``mean_abs`` and ``hessian`` are the layer's :class:`ActivationStatistics`.
    The error ``||X D^T||^2`` (``D`` the rounded weight less the
    weight) is taken as ``tr(D H D^T)`` under the layer's Hessian, not the rows again for every point of the grid."""
    # the candidates' errors through bf16 products where those are fast (the sum of each row of products in fp32): on
    # the real SmolLM2's layers the same alpha as in fp32 at half the search's time (benchmarks/results/real_llm.md)
    gram = hessian.to(weight.device)
    gram = gram.to(product_dtype(gram.device))
    mean_abs = mean_abs.to(weight.device).clamp(min=1e-4)
    rows, cols = weight.shape
    grouped = weight.abs().reshape(rows, cols // group_size, group_size)
    weight_mag = (grouped / grouped.amax(-1, keepdim=True).clamp(min=1e-8)).reshape(rows, cols).mean(0)
    buffer = torch.empty_like(weight)

    def error(s: torch.Tensor | None) -> float:
        diff = _rounding_error(weight, s, group_size, symmetric, buffer)
        return float(torch.dot((diff.to(gram.dtype) @ gram).float().view(-1), diff.view(-1)))

    def scale_at(step: int) -> torch.Tensor:
        alpha = step / grid_points
        s = (mean_abs.pow(alpha) / (weight_mag.pow(1 - alpha) + 1e-4)).clamp(min=1e-4)
        return s / (s.max() * s.min()).sqrt()

    # every COARSE_STRIDE-th point of the grid, then the points within COARSE_REACH of the best of them: on the real
    # SmolLM2's 120 searches the grid's own best every time, with 12 errors taken in place of 21
    # (benchmarks/results/real_llm.md, "AWQ's scale search, coarse then fine")
    errors: dict[int, float] = {}
    for step in range(0, grid_points, COARSE_STRIDE):
        errors[step] = error(scale_at(step))
    near = min(sorted(errors), key=errors.__getitem__)
    for step in range(max(0, near - COARSE_REACH), min(grid_points, near + COARSE_REACH + 1)):
        if step not in errors:
            errors[step] = error(scale_at(step))
    best_step = min(sorted(errors), key=errors.__getitem__)  # on a tie, the smallest alpha, as the grid's order gives
    if error(None) <= errors[best_step]:
        return None, None
    return scale_at(best_step), best_step / grid_points


def search_clip(weight: torch.Tensor, hessian: torch.Tensor, group_size: int, symmetric: bool,
                ratios: int = 20) -> torch.Tensor:
    """Per output row and group, the shrink ratio ``r`` of the grid's range with the least error
    of that group's contribution to the output (``[N, K // g]``, values in (0.5, 1]). Each group's
    error ``||X_g d_g^T||^2`` is taken as ``d_g H_gg d_g^T``, with ``H_gg`` the group's ``[g, g]`` block of the
    Hessian. Clipping the range to ``[r min, r max]`` is rounding on the grid of that range (the codes' clamp clips),
    so each ratio's grid comes from the group's least and greatest value, without a pass over the weight."""
    rows, cols = weight.shape
    groups = cols // group_size
    gram = hessian.reshape(groups, group_size, groups, group_size).diagonal(dim1=0, dim2=2).permute(2, 0, 1)
    gram = gram.contiguous()  # [G, g, g]: the Hessian's diagonal blocks
    w = weight.reshape(rows, groups, group_size).transpose(0, 1).contiguous()  # [G, N, g]
    best_err = torch.full((groups, rows), float("inf"), device=weight.device)
    best_ratio = torch.ones(groups, rows, device=weight.device)
    lo, hi = w.amin(-1, keepdim=True), w.amax(-1, keepdim=True)
    diff = torch.empty_like(w)
    for step in range(ratios):
        r = 1.0 - step * 0.5 / ratios
        scale, zero = range_grid(lo * r, hi * r, symmetric)
        torch.div(w, scale, out=diff).round_().add_(zero).clamp_(0, MAXQ).sub_(zero).mul_(scale).sub_(w)
        err = torch.bmm(diff, gram).mul_(diff).sum(-1)
        better = err < best_err
        best_err = torch.where(better, err, best_err)
        best_ratio.masked_fill_(better, r)
    return best_ratio.T


def awq_quantize(weight: torch.Tensor, stats: ActivationStatistics, group_size: int, symmetric: bool, *,
                 grid_points: int = 20, clip: bool = True,
                 hessian: torch.Tensor | None = None) -> tuple[Int4Weight, float | None]:
    """AWQ of ``weight`` ``[N, K]``: scale search, then clip search, then rounding on the clipped
    grid. Returns the weight and the ``alpha`` chosen (None: no scale). ``hessian``: ``stats.hessian.matrix``, where
    the caller has it already."""
    weight = weight.detach().float()
    hessian = (stats.hessian.matrix if hessian is None else hessian).to(weight.device)
    scale, alpha = search_scale(weight, stats.mean_abs, hessian, group_size, symmetric, grid_points)
    scaled = weight * scale[None, :] if scale is not None else weight
    rows, cols = scaled.shape
    if clip:
        ratio = search_clip(scaled, scaled_hessian(hessian, scale), group_size, symmetric)[..., None]
        grouped = scaled.reshape(rows, cols // group_size, group_size)
        clipped = torch.clamp(grouped, grouped.amin(-1, keepdim=True) * ratio, grouped.amax(-1, keepdim=True) * ratio)
        scales, zeros = group_grid(clipped.reshape(rows, cols), group_size, symmetric)
    else:
        scales, zeros = group_grid(scaled, group_size, symmetric)
    codes = group_codes(scaled, scales, zeros, group_size)
    return Int4Weight.from_codes(codes.cpu(), scales.cpu(), zeros.cpu(), group_size, symmetric,
                                 input_scale=ones_if_none(scale, cols)), alpha


def _quantize(weight: torch.Tensor, stats: ActivationStatistics, config: AWQConfig) -> Quantized:
    hessian = stats.hessian.matrix
    packed, alpha = awq_quantize(weight, stats, config.group_size, config.symmetric,
                                 grid_points=config.awq_grid, clip=config.awq_clip, hessian=hessian)
    # the reported error through the searches' products (bf16 where fast: a share of a percent of it, for ranking)
    absolute, relative = output_errors(weight.detach().float().cpu(), packed.effective_weight(),
                                       hessian.cpu().to(product_dtype(torch.device("cpu"))))
    return Quantized(packed, relative, alpha, output_error=absolute)


# one scale per layer, not per input: on the real MiniLM a scale shared by the query, key and value projections
# lost accuracy (mean cosine 0.978 against 0.98 or more); AWQ-GPTQ shares one, which folds into the norm
HANDLER = register(Int4Method(AWQConfig, _quantize, lambda config, in_features: ActivationStatistics(in_features)))
