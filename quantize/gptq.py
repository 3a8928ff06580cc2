"""GPTQ: second-order, error-compensating INT4 rounding of one Linear's weight.

Frantar, Ashkboos, Hoefler, Alistarh, "GPTQ: Accurate Post-Training Quantization for Generative
Pre-trained Transformers", ICLR 2023 (arXiv:2210.17323), Algorithm 1. For a layer ``y = x W^T``
it minimizes ``||X W^T - X Q^T||^2`` column by column: with the Hessian ``H = 2 X^T X / n`` of
that loss, each column ``w_k`` is rounded to ``q_k`` and the error ``(w_k - q_k) / [H^-1]_kk`` is
spread over the not-yet-quantized columns through row ``k`` of ``H^-1`` (its upper Cholesky
factor, so every update is one rank-1 step). Columns are processed in blocks of ``block_size``
with lazy batch updates (Sec. 3 "Lazy Batch-Updates"); ``damp`` times the mean diagonal is added
to ``H`` for numerical stability ("Cholesky Reformulation"). ``act_order`` processes columns in
order of decreasing ``H_kk`` (the activation-order heuristic of the reference code), and the
result then needs ``g_idx``: the group of each input feature in that order.

:class:`Hessian` accumulates ``H`` from streamed activations (GPTQ reference ``add_batch``), so
no activations are kept; :func:`gptq_quantize` is ``fasterquant``.
"""

from __future__ import annotations

import torch

from infopt.quantize.int4_config import GPTQConfig
from infopt.quantize.int4_format import Int4Weight, grid, quantize_codes
from infopt.quantize.int4_methods import Int4Method, Quantized, register, weighted_error


class Hessian:
    """Running ``2 X^T X / n`` over the rows of every batch a Linear sees."""

    def __init__(self, in_features: int):
        self.matrix = torch.zeros(in_features, in_features, dtype=torch.float32)
        self.rows = 0

    def add(self, inputs: torch.Tensor) -> None:
        x = inputs.detach().reshape(-1, inputs.shape[-1]).float()
        if self.matrix.device != x.device:
            self.matrix = self.matrix.to(x.device)
        n = x.shape[0]
        if n == 0:
            return
        self.matrix *= self.rows / (self.rows + n)
        self.rows += n
        x = x * (2.0 / self.rows) ** 0.5
        self.matrix += x.T @ x


def _inverse_cholesky(h: torch.Tensor, damp: float) -> torch.Tensor:
    """Upper Cholesky factor of ``(H + damp * mean(diag H) * I)^-1``, raising the damping until
    ``H`` factors (a rank-deficient ``H`` comes from too few calibration rows)."""
    mean = torch.mean(torch.diag(h))
    eye = torch.eye(h.shape[0], dtype=h.dtype, device=h.device)
    for attempt in range(6):
        try:
            factor = torch.linalg.cholesky(h + eye * (damp * 10 ** attempt) * mean)
            inverse = torch.cholesky_inverse(factor)
            return torch.linalg.cholesky(inverse, upper=True)
        except torch.linalg.LinAlgError:
            continue
    raise torch.linalg.LinAlgError("the Hessian is not positive definite even with 1e5x damping")


def gptq_quantize(weight: torch.Tensor, hessian: torch.Tensor, group_size: int, symmetric: bool, *,
                  damp: float = 0.01, act_order: bool = False, block_size: int = 128) -> Int4Weight:
    """GPTQ (Algorithm 1 with lazy batches) of ``weight`` ``[N, K]`` under ``hessian`` ``[K, K]``."""
    w = weight.detach().float().clone()
    h = hessian.detach().float().clone()
    rows, cols = w.shape
    dead = torch.diag(h) == 0
    h[dead, dead] = 1
    w[:, dead] = 0
    perm = torch.argsort(torch.diag(h), descending=True) if act_order else torch.arange(cols, device=w.device)
    w, h = w[:, perm], h[perm][:, perm]
    hinv = _inverse_cholesky(h, damp)

    groups = cols // group_size
    scales = torch.zeros(rows, groups, device=w.device)
    zeros = torch.zeros(rows, groups, device=w.device)
    codes = torch.zeros(rows, cols, device=w.device)
    for start in range(0, cols, block_size):
        end = min(start + block_size, cols)
        block = w[:, start:end].clone()
        errors = torch.zeros_like(block)
        hblock = hinv[start:end, start:end]
        for i in range(end - start):
            col = start + i
            if col % group_size == 0:
                inside = block[:, i:i + group_size]
                ahead = torch.cat([inside, w[:, end:end + group_size - inside.shape[1]]], dim=1)
                scale, zero = grid(ahead, symmetric)
                scales[:, col // group_size], zeros[:, col // group_size] = scale, zero
            column = block[:, i]
            code = quantize_codes(column[:, None], scale, zero)[:, 0]
            codes[:, col] = code
            err = (column - (code - zero) * scale) / hblock[i, i]
            block[:, i:] -= err[:, None] * hblock[i, i:][None, :]
            errors[:, i] = err
        w[:, end:] -= errors @ hinv[start:end, end:]

    inverse = torch.argsort(perm).cpu()
    g_idx = (torch.arange(cols) // group_size)[inverse] if act_order else None
    return Int4Weight.from_codes(codes.cpu()[:, inverse], scales.cpu(), zeros.cpu(), group_size, symmetric, g_idx=g_idx)


def _quantize(weight: torch.Tensor, hessian: Hessian, config: GPTQConfig) -> Quantized:
    packed = gptq_quantize(weight, hessian.matrix, config.group_size, config.symmetric, damp=config.damp,
                           act_order=config.act_order, block_size=config.block_size)
    return Quantized(packed, weighted_error(weight.cpu(), packed.effective_weight(), hessian.matrix.cpu()))


HANDLER = register(Int4Method(GPTQConfig, _quantize, lambda config, in_features: Hessian(in_features)))
