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
from infopt.quantize.int4_format import MAXQ, Int4Weight, grid
from infopt.quantize.int4_methods import Int4Method, Quantized, register, relative_error


class Hessian:
    """Running ``2 X^T X / n`` over the rows of every batch a Linear sees: ``X^T X`` summed as the rows come
    (one ``addmm`` a batch), scaled once when read."""

    def __init__(self, in_features: int):
        self.sum = torch.zeros(in_features, in_features, dtype=torch.float32)
        self.rows = 0

    def add(self, inputs: torch.Tensor) -> None:
        x = inputs.detach().reshape(-1, inputs.shape[-1])
        if x.shape[0] == 0:
            return
        if self.sum.device != x.device:
            self.sum = self.sum.to(x.device)
        self.rows += x.shape[0]
        if x.dtype == torch.bfloat16:
            # a bf16 model's activations are exact in bf16, and the matmul sums their products in fp32: only each
            # batch's sum is rounded (to 8 bits), then added here in fp32. Several times faster on CPUs with bf16
            # units, with GPTQ's error unchanged (measured in benchmarks/results/real_llm.md)
            self.sum.add_(x.T @ x)
        else:
            self.sum.addmm_(x.T.float(), x.float())

    @property
    def matrix(self) -> torch.Tensor:
        return self.sum * (2.0 / max(self.rows, 1))


def _inverse_cholesky(h: torch.Tensor, damp: float) -> tuple[torch.Tensor, float]:
    """Upper Cholesky factor of ``(H + lam * I)^-1`` and the ``lam`` it took: ``damp * mean(diag H)``, raised until
    ``H`` factors (a rank-deficient ``H`` comes from too few calibration rows).

    With ``J`` the reversal of the order, ``J H J = L L^T`` makes ``H = R R^T`` with ``R = J L J`` upper triangular,
    so ``H^-1 = (R^-1)^T R^-1``: the factor is ``R^-1 = J L^-1 J``. One Cholesky and one triangular inverse, where
    inverting ``H`` and factoring its inverse take two Cholesky factorizations and an inverse."""
    mean = float(torch.mean(torch.diag(h)))
    reversed_h = h.flip(0, 1)  # a copy; its diagonal is H's, reversed
    added = 0.0
    for attempt in range(6):
        lam = damp * 10 ** attempt * mean
        reversed_h.diagonal().add_(lam - added)
        added = lam
        factor, info = torch.linalg.cholesky_ex(reversed_h)
        if int(info) == 0:
            return _lower_inverse(factor).flip(0, 1), lam
    raise torch.linalg.LinAlgError("the Hessian is not positive definite even with 1e5x damping")


TRIANGULAR_BLOCK = 512
"""below this size a triangular inverse is one triangular solve; above it, two half-size inverses and two products,
which run at the matrix product's speed (timed in benchmarks/results/real_llm.md)"""


def _lower_inverse(lower: torch.Tensor) -> torch.Tensor:
    """``L^-1`` of a lower triangular ``L``: ``[[A, 0], [C, D]]^-1 = [[A^-1, 0], [-D^-1 C A^-1, D^-1]]``."""
    n = lower.shape[0]
    if n <= TRIANGULAR_BLOCK:
        return torch.linalg.solve_triangular(lower, torch.eye(n, dtype=lower.dtype, device=lower.device), upper=False)
    half = n // 2
    out = torch.zeros_like(lower)
    first, last = _lower_inverse(lower[:half, :half]), _lower_inverse(lower[half:, half:])
    out[:half, :half], out[half:, half:] = first, last
    torch.mm(last, lower[half:, :half] @ first, out=out[half:, :half]).neg_()
    return out


def gptq_quantize(weight: torch.Tensor, hessian: torch.Tensor, group_size: int, symmetric: bool, *,
                  damp: float = 0.01, act_order: bool = False, block_size: int = 128) -> Int4Weight:
    """GPTQ (Algorithm 1 with lazy batches) of ``weight`` ``[N, K]`` under ``hessian`` ``[K, K]``."""
    return gptq_with_error(weight, hessian, group_size, symmetric, damp, act_order, block_size)[0]


def gptq_with_error(weight: torch.Tensor, hessian: torch.Tensor, group_size: int, symmetric: bool, damp: float,
                    act_order: bool, block_size: int) -> tuple[Int4Weight, float]:
    """:func:`gptq_quantize`, and the output error ``tr(E H E^T)`` of the rounding, ``E = W - Q``.

    Each step's loss ``err^2`` is what fixing that column adds to the error under the damped Hessian
    ``H + lam * I`` (the rest of the row then optimal), so their sum is ``tr(E (H + lam * I) E^T)``: less
    ``lam * ||E||^2``, the error under ``H``. One product of ``E`` with ``H`` fewer than computing it again."""
    w = weight.detach().float().clone()
    h = hessian.detach().float().clone()
    rows, cols = w.shape
    dead = torch.diag(h) == 0
    h[dead, dead] = 1
    w[:, dead] = 0
    perm = torch.argsort(torch.diag(h), descending=True) if act_order else torch.arange(cols, device=w.device)
    w, h = w[:, perm], h[perm][:, perm]
    hinv, lam = _inverse_cholesky(h, damp)

    # columns as rows ([K, N]): each column GPTQ rounds is contiguous, and its error reaches the rest of the lazy
    # block in one rank-1 update (addr_)
    wt = w.T.contiguous()
    groups = cols // group_size
    scales = torch.zeros(groups, rows, device=w.device)
    zeros = torch.zeros(groups, rows, device=w.device)
    codes = torch.zeros(cols, rows, device=w.device)
    pivots = torch.diagonal(hinv).tolist()  # each column's divisor as a number: no tensor indexed per column
    damped = 0.0
    for start in range(0, cols, block_size):
        end = min(start + block_size, cols)
        block = wt[start:end].clone()
        errors = torch.zeros_like(block)
        hblock = hinv[start:end, start:end]
        for i in range(end - start):
            col = start + i
            if col % group_size == 0:
                inside = block[i:i + group_size]
                ahead = torch.cat([inside, wt[end:end + group_size - inside.shape[0]]], dim=0)
                scale, zero = grid(ahead.T, symmetric)
                scales[col // group_size], zeros[col // group_size] = scale, zero
            # written into their rows of codes and errors, each step in place: the loop runs once per input
            # feature, and its cost is the ops' count more than their size
            column, code, err = block[i], codes[col], errors[i]
            torch.div(column, scale, out=code).round_().add_(zero).clamp_(0, MAXQ)
            torch.sub(code, zero, out=err).mul_(scale)
            torch.sub(column, err, out=err).div_(pivots[col])
            block[i + 1:].addr_(hblock[i, i + 1:], err, alpha=-1)
        wt[end:].addmm_(hinv[start:end, end:].T, errors, alpha=-1)
        damped += float(errors.square().sum(dtype=torch.float64))
    codes, scales, zeros = codes.T, scales.T, zeros.T

    inverse = torch.argsort(perm).cpu()
    g_idx = (torch.arange(cols) // group_size)[inverse] if act_order else None
    packed = Int4Weight.from_codes(codes.cpu()[:, inverse], scales.cpu(), zeros.cpu(), group_size, symmetric,
                                   g_idx=g_idx)
    # E taken on what was rounded: the weight with its dead columns zeroed (H has no row for them), in its order
    spread = float(torch.sub(w.cpu()[:, inverse], packed.effective_weight()).square().sum(dtype=torch.float64))
    return packed, max(damped - lam * spread, 0.0)


def _quantize(weight: torch.Tensor, hessian: Hessian, config: GPTQConfig) -> Quantized:
    matrix = hessian.matrix
    packed, absolute = gptq_with_error(weight, matrix, config.group_size, config.symmetric, config.damp, config.act_order,
                             config.block_size)
    return Quantized(packed, relative_error(absolute, weight.detach().float().cpu(), matrix.cpu()),
                     output_error=absolute)


HANDLER = register(Int4Method(GPTQConfig, _quantize, lambda config, in_features: Hessian(in_features), stacks=True))
