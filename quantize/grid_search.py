"""Each group's grid chosen to minimize its weighted squared rounding error, not taken from its min and max.

For a group ``x`` (``g`` weights of one output row) with importances ``w``, the grid is a scale ``s`` and an integer
zero point ``z`` (``0 <= z <= maxq``, as ``MatMulNBits`` stores it), and ``x`` stands for
``s * (clamp(round(x / s) + z, 0, maxq) - z)``. :func:`weighted_grid` tries a ladder of steps around the min/max
step (``maxq + delta`` levels over the range, ``delta`` from -1 to +1, the span llama.cpp's ``make_qkx2_quants``
searches for its k-quants); for each it rounds the group, then refits the scale to those codes by weighted least
squares: ``s = sum(w d x) / sum(w d^2)`` with ``d = q - z``, whose error is ``sum(w x^2) - sum(w d x)^2 / sum(w d^2)``
without another pass. The candidate with the least error wins; the caller then rounds to its grid, which can only
lower the error further.

The importances say which weights matter: with calibration data, each input channel's mean squared activation
(GPTQ's Hessian diagonal, what llama.cpp's importance matrix holds); without data, :func:`magnitude_weights`
(llama.cpp's ``quantize_row_q4_K_ref``: larger weights, larger errors).
"""

from __future__ import annotations

import torch

STEPS = tuple(-1 + 0.2 * i for i in range(11))
"""levels added to ``maxq`` over the group's range for each candidate step: 14 to 16 for 4 bits. Eleven rungs lost
what llama.cpp's 21 did on the real SmolLM2, in half the time (``benchmarks/results/real_llm.md``)"""
SEARCH_ROWS = 4096
"""groups searched at a time: their temporaries stay within the CPU's cache"""


def magnitude_weights(groups: torch.Tensor) -> torch.Tensor:
    """The data-free importance of each weight of ``groups`` ``[rows, g]``: its magnitude plus the group's root mean
    square (llama.cpp's k-quants without an importance matrix), so a large weight's error counts for more and a
    small one's still counts."""
    return groups.square().mean(dim=1, keepdim=True).sqrt_().add(groups.abs())


def weighted_grid(groups: torch.Tensor, importance: torch.Tensor | None = None, maxq: int = 15,
                  symmetric: bool = False, steps: tuple[float, ...] = STEPS) -> tuple[torch.Tensor, torch.Tensor]:
    """Scale and zero point per row of ``groups`` ``[rows, g]`` (float32) minimizing the weighted squared rounding
    error, ``importance`` ``[rows, g]`` or ``[g]`` (None: :func:`magnitude_weights`), over the rungs ``steps``.
    Symmetric: the zero point is ``(maxq + 1) / 2`` and only the scale is searched."""
    scales, zeros = [], []
    for start in range(0, groups.shape[0], SEARCH_ROWS):
        rows = groups[start:start + SEARCH_ROWS]
        if importance is None:
            weights = magnitude_weights(rows)
        elif importance.dim() == 1:
            weights = importance[None, :].expand_as(rows)
        else:
            weights = importance[start:start + SEARCH_ROWS]
        scale, zero = _search(rows, weights, maxq, symmetric, steps)
        scales.append(scale)
        zeros.append(zero)
    return torch.cat(scales), torch.cat(zeros)


def _search(x: torch.Tensor, w: torch.Tensor, maxq: int, symmetric: bool,
            steps: tuple[float, ...]) -> tuple[torch.Tensor, torch.Tensor]:
    low, high = x.amin(dim=1).clamp(max=0), x.amax(dim=1).clamp(min=0)
    if symmetric:
        span = torch.maximum(-low, high) * 2
        zero = torch.full_like(span, (maxq + 1) // 2)
    else:
        span = high - low
    span = span.clamp(min=torch.finfo(x.dtype).tiny)
    weighted = w * x
    codes, product = torch.empty_like(x), torch.empty_like(x)
    energy = torch.mul(weighted, x, out=product).sum(dim=1)
    best = torch.full_like(span, float("inf"))
    best_scale = torch.ones_like(span)
    best_zero = zero.clone() if symmetric else torch.zeros_like(span)
    # elementwise products summed, and maximum/minimum for the per-row bounds: on a 2-core AVX2 CPU each took a third
    # to a fifth of vecdot's and a clamp to tensors' time (benchmarks/results/rules.md)
    for delta in steps:
        inverse = (maxq + delta) / span
        if not symmetric:
            zero = torch.round(-low * inverse).clamp_(0, maxq)
        # d = q - z: the rounded value clamped to the codes, less the zero point
        torch.mul(x, inverse[:, None], out=codes).round_()
        torch.maximum(codes, (-zero)[:, None], out=codes)
        torch.minimum(codes, (maxq - zero)[:, None], out=codes)
        cross = torch.mul(codes, weighted, out=product).sum(dim=1)
        square = torch.mul(codes, w, out=product).mul_(codes).sum(dim=1)
        error = energy - cross * cross / square.clamp(min=1e-30)
        better = (error < best) & (square > 0) & (cross > 0)
        best = torch.where(better, error, best)
        best_scale = torch.where(better, cross / square.clamp(min=1e-30), best_scale)
        best_zero = torch.where(better, zero, best_zero)
    return best_scale, best_zero
