"""GPTQ: second-order, error-compensating INT4 rounding of one Linear's weight.

Frantar, Ashkboos, Hoefler, Alistarh, "GPTQ: Accurate Post-Training Quantization for Generative
Pre-trained Transformers", ICLR 2023 (arXiv:2210.17323), Algorithm 1. For a layer ``y = x W^T``
it minimizes ``||X W^T - X Q^T||^2`` column by column: with the Hessian ``H = 2 X^T X / n`` of
that loss, each column ``w_k`` is rounded to ``q_k`` at its optimal value given the columns rounded
before it. The paper spreads each error over later columns through the upper Cholesky factor of
``H^-1``; here each column reads the same value from the lower factor of ``H`` itself (:class:`_Reach`),
one factorization and no inverse. Columns are processed in blocks of ``block_size`` with lazy batch
updates (Sec. 3 "Lazy Batch-Updates"); ``damp`` times the mean diagonal is added
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


def _hessian_factor(reversed_h: torch.Tensor, damp: float) -> tuple[torch.Tensor, float]:
    """The lower Cholesky factor ``L`` of ``J (H + lam * I) J``, ``J`` the reversal of the order, and the ``lam`` it
    took: ``damp * mean(diag H)``, raised until ``H`` factors (a rank-deficient ``H`` comes from too few
    calibration rows). ``H + lam * I = A^T A`` with ``A = J L^T J`` lower triangular: see :class:`_Reach`.
    ``reversed_h`` is ``J H J``, a copy this function damps in place."""
    mean = float(torch.mean(torch.diagonal(reversed_h).flip(0)))  # summed in the columns' order
    added = 0.0
    for attempt in range(6):
        lam = damp * 10 ** attempt * mean
        reversed_h.diagonal().add_(lam - added)
        added = lam
        factor, info = torch.linalg.cholesky_ex(reversed_h)
        if int(info) == 0:
            return factor, lam
    raise torch.linalg.LinAlgError("the Hessian is not positive definite even with 1e5x damping")


class _Reach:
    """How the rounding errors of earlier columns move each later column's optimal value.

    With ``H = A^T A``, ``A`` lower triangular, the error ``tr(E H E^T)`` is the sum over columns ``k`` of
    ``(sum_{j <= k} A_kj e_j)^2``: once columns ``j < k`` are rounded, column ``k``'s best value is
    ``w_k + sum_{j < k} (A_kj / A_kk) e_j``, and the step's loss is ``A_kk`` times what rounding it then misses.
    That is GPTQ's update, since ``A`` is the inverse transpose of its factor (the upper Cholesky factor of
    ``H^-1``), with one Cholesky factorization and no inverse. ``A = J L^T J`` is never built: its rows are read
    from ``L`` as a transposed slice, against the errors kept in reverse order."""

    def __init__(self, lower: torch.Tensor, rows: int):
        self.lower, self.cols = lower, lower.shape[0]
        self.pivots = torch.diagonal(lower).flip(0)  # A_kk, in the columns' order
        self.errors = torch.zeros(self.cols, rows, dtype=lower.dtype, device=lower.device)
        """``e_j = w_j - q_j`` of the rounded columns, column ``j`` in row ``cols - 1 - j``"""

    def error_row(self, col: int) -> torch.Tensor:
        return self.errors[self.cols - 1 - col]

    def carried(self, start: int, end: int, before: int) -> torch.Tensor:
        """``sum_{j < before} (A_kj / A_kk) e_j`` for each column ``k`` in ``[start, end)``: ``[end - start, N]``."""
        k = self.cols
        past = self.lower[k - before:, k - end:k - start].T @ self.errors[k - before:]
        return past.flip(0).div_(self.pivots[start:end, None])

    def block(self, start: int, end: int) -> torch.Tensor:
        """``A[start:end, start:end]``, lower triangular."""
        k = self.cols
        return self.lower[k - end:k - start, k - end:k - start].flip(0, 1).T


def _groups_by_importance(diagonal: torch.Tensor, group_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The column order that takes whole groups by decreasing largest Hessian diagonal, and each group's columns by
    decreasing diagonal; and the groups' order. Each group keeps its own columns, so no ``g_idx`` is needed.
    On real trained weights this order loses less than the weight's own order; the measurement is in
    benchmarks/results/real_llm.md, "GPTQ takes whole groups by importance"."""
    by_group = diagonal.reshape(-1, group_size)
    order = torch.argsort(by_group.amax(dim=1), descending=True)
    starts = torch.arange(by_group.shape[0], device=diagonal.device)[:, None] * group_size
    inside = torch.argsort(by_group, dim=1, descending=True) + starts
    return inside[order].reshape(-1), order


def gptq_quantize(weight: torch.Tensor, hessian: torch.Tensor, group_size: int, symmetric: bool, *,
                  damp: float = 0.01, act_order: bool = False, block_size: int = 128,
                  group_order: bool = True) -> Int4Weight:
    """GPTQ (Algorithm 1 with lazy batches) of ``weight`` ``[N, K]`` under ``hessian`` ``[K, K]``."""
    return gptq_with_error(weight, hessian, group_size, symmetric, damp, act_order, block_size, group_order)[0]


def gptq_with_error(weight: torch.Tensor, hessian: torch.Tensor, group_size: int, symmetric: bool, damp: float,
                    act_order: bool, block_size: int, group_order: bool) -> tuple[Int4Weight, float]:
    """:func:`gptq_quantize`, and the output error ``tr(E H E^T)`` of the rounding, ``E = W - Q``. ``group_order``
    (without ``act_order``) takes the columns in :func:`_groups_by_importance`'s order.

    Each step's loss ``err^2`` is what fixing that column adds to the error under the damped Hessian
    ``H + lam * I`` (the rest of the row then optimal), so their sum is ``tr(E (H + lam * I) E^T)``: less
    ``lam * ||E||^2``, the error under ``H``. One product of ``E`` with ``H`` fewer than computing it again."""
    dtype = torch.float64 if weight.dtype == torch.float64 else torch.float32  # float64 stays, for exact checks
    w = weight.detach().to(dtype, copy=True)
    h = hessian.detach().to(dtype)
    rows, cols = w.shape
    diagonal = torch.diag(h)
    dead = diagonal == 0
    diagonal[dead] = 1  # a feature no row reached: its column is zeroed, and H gets a unit pivot for it
    w[:, dead] = 0
    perm = group_perm = None  # the columns' order, and (whole groups) the groups' order; None: the weight's own
    if act_order:
        perm = torch.argsort(diagonal, descending=True)
    elif group_order and cols // group_size > 1:
        perm, group_perm = _groups_by_importance(diagonal, group_size)
    # the factorization takes H in reversed order: one copy of a wide H, gathered in that order or flipped
    if perm is not None:
        w, backwards = w[:, perm], perm.flip(0)
        reversed_h = h[backwards][:, backwards]
        reversed_h.diagonal().copy_(diagonal[backwards])
    else:
        reversed_h = h.flip(0, 1)
        reversed_h.diagonal().copy_(diagonal.flip(0))
    lower, lam = _hessian_factor(reversed_h, damp)
    reach = _Reach(lower, rows)
    pivots = reach.pivots.tolist()  # each column's A_kk as a number: no tensor indexed per column

    # columns as rows ([K, N]): each column GPTQ rounds is contiguous, and its error reaches the rest of the lazy
    # block in one rank-1 update (addr_)
    wt = w.T.contiguous()
    groups = cols // group_size
    scales = torch.zeros(groups, rows, device=w.device)
    zeros = torch.zeros(groups, rows, device=w.device)
    codes = torch.zeros(cols, rows, device=w.device)
    damped = 0.0
    block_size = -(-max(block_size, group_size) // group_size) * group_size  # whole groups in each block
    for start in range(0, cols, block_size):
        end = min(start + block_size, cols)
        # each column's optimal value given every column before the block: one product a block (lazy updates)
        block = reach.carried(start, end, start).add_(wt[start:end])
        lower = reach.block(start, end)
        inner = (lower / torch.diagonal(lower)[:, None]).T.contiguous()  # row i: column i's reach in the block
        loss = torch.zeros_like(block)
        for i in range(end - start):
            col = start + i
            if col % group_size == 0:
                # the group's grid from its columns' optimal values given the columns rounded so far: GPTQ's
                # updated weights. block holds partial sums; the group's own triangle of A completes them
                ahead = slice(i, i + group_size)
                partial = (block[ahead] - wt[col:col + group_size]).mul_(reach.pivots[col:col + group_size, None])
                best = torch.linalg.solve_triangular(lower[ahead, ahead], partial, upper=False)
                scale, zero = grid(best.add_(wt[col:col + group_size]).T, symmetric)
                scales[col // group_size], zeros[col // group_size] = scale, zero
            # written into their rows of codes and losses, each step in place: the loop runs once per input
            # feature, and its cost is the ops' count more than their size
            column, code, err, gone = block[i], codes[col], loss[i], reach.error_row(col)
            torch.div(column, scale, out=code).round_().add_(zero).clamp_(0, MAXQ)
            torch.sub(code, zero, out=err).mul_(scale)
            torch.sub(wt[col], err, out=gone)
            torch.sub(column, err, out=err).mul_(pivots[col])
            block[i + 1:].addr_(inner[i, i + 1:], gone)
        damped += float(loss.square().sum(dtype=torch.float64))
    codes, scales, zeros = codes.T, scales.T, zeros.T

    codes = codes.cpu()
    g_idx = None
    if perm is not None:  # back to the weight's own order
        inverse = torch.argsort(perm).cpu()
        codes = codes[:, inverse]
        if group_perm is None:  # act-order: each column names its group
            g_idx = (torch.arange(cols) // group_size)[inverse]
        else:  # whole groups: scales and zeros back in the groups' own order
            back = torch.argsort(group_perm).cpu()
            scales, zeros = scales[:, back], zeros[:, back]
    packed = Int4Weight.from_codes(codes, scales.cpu(), zeros.cpu(), group_size, symmetric, g_idx=g_idx)
    # ||E||^2 from the errors kept as the columns were rounded: the weight with its dead columns zeroed (H has no
    # row for them) less its rounded values, as the packed weight dequantizes them
    spread = float(reach.errors.square().sum(dtype=torch.float64))
    return packed, max(damped - lam * spread, 0.0)


def _quantize(weight: torch.Tensor, hessian: Hessian, config: GPTQConfig) -> Quantized:
    matrix = hessian.matrix
    packed, absolute = gptq_with_error(weight, matrix, config.group_size, config.symmetric, config.damp,
                                       config.act_order, config.block_size, config.group_order)
    return Quantized(packed, relative_error(absolute, weight.detach().float().cpu(), matrix.cpu()),
                     output_error=absolute)


HANDLER = register(Int4Method(GPTQConfig, _quantize, lambda config, in_features: Hessian(in_features), stacks=True))
