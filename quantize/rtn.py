"""Round-to-nearest (RTN) group-wise INT4: every weight to its nearest point on its group's grid.

No data needed. Each group of ``g`` input features of an output row gets the grid whose rounding error, each weight's
weighted by its magnitude, is least (:func:`infopt.quantize.grid_search.weighted_grid`, ``RTNConfig.grid``), or
with ``grid: minmax`` the min/max grid of :func:`infopt.quantize.int4_format.grid`. What each costs on the real
SmolLM2: ``benchmarks/results/real_llm.md``.
"""

from __future__ import annotations

import torch

from infopt.core.memory import drop_file_pages, file_mappings
from infopt.quantize.grid_search import weighted_grid
from infopt.quantize.int4_config import RTNConfig
from infopt.quantize.int4_format import Int4Weight, grid, quantize_codes
from infopt.quantize.int4_methods import Int4Method, Quantized, register


def group_grid(weight: torch.Tensor, group_size: int, symmetric: bool,
               search: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Scales and zeros ``[N, K // g]`` for ``weight`` ``[N, K]``: the min/max grid, or with ``search`` the one
    with the least rounding error, each weight's weighted by its magnitude."""
    rows, cols = weight.shape
    groups = weight.reshape(-1, group_size)
    scale, zero = weighted_grid(groups, symmetric=symmetric) if search else grid(groups, symmetric)
    return scale.reshape(rows, cols // group_size), zero.reshape(rows, cols // group_size)


CODE_ROWS = 4096
"""rows coded at a time: the expanded grid and the temporaries stay a few MB, not several copies of the weight (an
LM's 151936-row head in fp32 is 545 MB)"""


def group_codes(weight: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor, group_size: int) -> torch.Tensor:
    """Codes ``[N, K]`` (uint8) for ``weight`` on the group grid ``scales``/``zeros`` ``[N, K // g]``."""
    codes = torch.empty(weight.shape, dtype=torch.uint8, device=weight.device)
    for start in range(0, weight.shape[0], CODE_ROWS):
        rows = slice(start, start + CODE_ROWS)
        grouped = weight[rows].reshape(-1, weight.shape[1] // group_size, group_size)  # the grid broadcast per group
        codes[rows] = quantize_codes(grouped, scales[rows, :, None], zeros[rows, :, None]).reshape(-1, weight.shape[1])
    return codes


BLOCK_ELEMENTS = 1 << 20
"""weights rounded at a time by :func:`rtn_quantize` (4 MB in float32): the block is widened, its grid searched and
its codes computed while it sits in the CPU's cache, instead of each step passing over the whole weight"""


def rtn_quantize(weight: torch.Tensor, group_size: int, symmetric: bool,
                 input_scale: torch.Tensor | None = None, search: bool = True, read_only_file: bool = False) -> Int4Weight:
    """RTN of ``weight`` ``[N, K]`` (already multiplied by ``input_scale`` if there is one), on the searched
    grid (``search``) or the plain min/max one. A bf16/fp16 weight is widened to float32 a block of rows at a
    time, never whole. With ``read_only_file`` (a weight mapping a file that nothing wrote to, such as the ONNX
    head's tied table, 545 MB at Qwen2.5-0.5B's shape) each block's pages are handed back once it is rounded, so the
    whole table is never resident; never for a weight changed in place (its changes would be lost)."""
    weight = weight.detach()
    mappings = file_mappings() if read_only_file else []
    rows, cols = weight.shape
    codes = torch.empty(weight.shape, dtype=torch.uint8, device=weight.device)
    scales = torch.empty(rows, cols // group_size, dtype=torch.float32, device=weight.device)
    zeros = torch.empty_like(scales)
    step = max(1, BLOCK_ELEMENTS // cols)
    for start in range(0, rows, step):
        block = slice(start, start + step)
        wide = weight[block].float()
        scales[block], zeros[block] = group_grid(wide, group_size, symmetric, search)
        codes[block] = group_codes(wide, scales[block], zeros[block], group_size)
        drop_file_pages(weight[block], mappings)
    return Int4Weight.from_codes(codes.cpu(), scales.cpu(), zeros.cpu(), group_size, symmetric,
                                 input_scale=None if input_scale is None else input_scale.cpu())


def _quantize(weight: torch.Tensor, _statistic: None, config: RTNConfig) -> Quantized:
    return Quantized(rtn_quantize(weight, config.group_size, config.symmetric, search=config.grid == "search"), None)


HANDLER = register(Int4Method(RTNConfig, _quantize))
