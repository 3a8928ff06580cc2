"""Weight-only INT8: each weight rounded to its block's 8-bit grid, the activations left in float.

An LLM's activations have outliers (a trained 135M Llama's ``down_proj`` input peaks at about 25,000 times its
mean magnitude), so one INT8 scale per activation tensor rounds nearly every value to zero. Its weights have no
such outliers: 256 levels per block of ``g`` input features keep them within a fraction of a percent, and the
activations are never quantized. ONNX Runtime computes the result with ``MatMulNBits`` (``bits=8``).

For ``N`` outputs, ``K`` inputs and ``G = K // g`` blocks: codes uint8 ``[N, K]``, scales ``[N, G]`` (float32
holding float16 values, as the folder stores them: ``passes/decoder/half_scales.py``), zero points uint8 ``[N, G]``,
and ``W[n, k] = (code - zero) * scale``. The default grid is llama.cpp Q8_0's size, symmetric (``zero = 128``, the
op's default, so no zero points are stored: 8.5 bits a weight), its scale searched for the least squared error
(``grid_search.weighted_grid``): on the rotated SmolLM2 it lost what the asymmetric grid's 8.75 bits lost, where
``scale = max|w| / 127`` lost twice that (``benchmarks/results/real_llm.md``). Asymmetric:
``scale = (max - min) / 255`` over the block's range widened to hold 0, ``zero = round(-min / scale)``.
"""

from __future__ import annotations

import torch

from infopt.quantize.grid_search import weighted_grid

MAXQ = 255
SYMMETRIC_ZERO = 128
"""the zero point of the symmetric grid, and ``MatMulNBits``' default for 8 bits (``2 ** (bits - 1)``)"""
BLOCK_ELEMENTS = 1 << 20
"""weights rounded at a time (4 MB in float32), so the temporaries stay small beside a large head"""


EIGHT_BIT_STEPS = (-2.0, -1.0, 0.0)
"""the rungs searched at 8 bits (levels added to 255 over the block's span): on the rotated SmolLM2's weights these
three found grids of the same squared error as :data:`grid_search.STEPS`' eleven, in under a third of the time"""
HALF_TINY = 2.0 ** -24
"""float16's smallest step: a scale below it would be stored as 0"""


def block_grid(blocks: torch.Tensor, symmetric: bool, search: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Scale (rounded to float16) and zero point per row of ``blocks`` ``[rows, g]`` (float32)."""
    if symmetric and search:
        scale, zero = weighted_grid(blocks, torch.ones(blocks.shape[1]), MAXQ, symmetric=True, steps=EIGHT_BIT_STEPS)
        return scale.clamp(min=HALF_TINY).half().float(), zero  # the search clamps its codes: any scale will do
    if symmetric:
        scale = blocks.abs().amax(dim=1) / (SYMMETRIC_ZERO - 1)
        zero = torch.full_like(scale, SYMMETRIC_ZERO)
    else:
        low, high = blocks.amin(dim=1).clamp(max=0), blocks.amax(dim=1).clamp(min=0)
        scale = (high - low) / MAXQ
        zero = None
    scale = half_at_least(torch.where(scale == 0, torch.ones_like(scale), scale).clamp(min=HALF_TINY))
    if zero is None:
        zero = torch.round(-low / scale).clamp(0, MAXQ)
    return scale, zero


def half_at_least(scale: torch.Tensor) -> torch.Tensor:
    """The least float16 value at or above each of ``scale``, as float32: the block's range still fits its codes."""
    half = scale.half()
    up = torch.nextafter(half, torch.full_like(half, float("inf")))
    return torch.where(half.float() < scale, up, half).float()


def quantize_8bit(weight: torch.Tensor, group_size: int, symmetric: bool = True, search: bool = True):
    """Codes uint8 ``[N, K]``, scales float32 ``[N, K // g]`` and zero points uint8 ``[N, K // g]`` of ``weight``
    ``[N, K]`` (any float dtype; widened a block of rows at a time); ``search``: the symmetric grid's scale searched
    (the default), else ``max|w| / 127``."""
    rows, cols = weight.shape
    if cols % group_size:
        raise ValueError(f"group size {group_size} does not divide the {cols} input features")
    groups = cols // group_size
    codes = torch.empty(rows, cols, dtype=torch.uint8)
    scales = torch.empty(rows, groups, dtype=torch.float32)
    zeros = torch.empty(rows, groups, dtype=torch.uint8)
    step = max(1, BLOCK_ELEMENTS // cols)
    for start in range(0, rows, step):
        part = slice(start, start + step)
        blocks = weight[part].detach().float().reshape(-1, group_size)
        scale, zero = block_grid(blocks, symmetric, search)
        code = torch.round(blocks / scale[:, None]).add_(zero[:, None]).clamp_(0, MAXQ)
        codes[part] = code.to(torch.uint8).reshape(-1, cols)
        scales[part] = scale.reshape(-1, groups)
        zeros[part] = zero.to(torch.uint8).reshape(-1, groups)
    return codes, scales, zeros


def dequantize_8bit(codes: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor) -> torch.Tensor:
    """The float32 weight ``[N, K]`` the codes stand for."""
    rows, cols = codes.shape
    group_size = cols // scales.shape[1]
    blocks = codes.float().reshape(rows, -1, group_size) - zeros.float()[..., None]
    return (blocks * scales[..., None]).reshape(rows, cols)
