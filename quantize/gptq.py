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

import functools

import numpy as np
import torch

from infopt.core.cpu_features import bf16_products_fast
from infopt.quantize.grid_search import weighted_grid
from infopt.quantize.int4_config import GPTQConfig, GridName
from infopt.quantize.int4_format import MAXQ, Int4Weight, grid
from infopt.quantize.int4_methods import Int4Method, Quantized, register, relative_error


class Hessian:
    """Running ``2 X^T X / n`` over the rows of every batch a Linear sees: ``X^T X`` summed as the rows come
    (one product a batch, or one per band of columns for a wide layer), scaled once when read."""

    BAND = 512
    """columns per band of the lower triangle for a layer wider than ``4 * BAND`` (see :meth:`add`)"""

    def __init__(self, in_features: int):
        self.sum = torch.zeros(in_features, in_features, dtype=torch.float32)
        self.rows = 0
        self.banded = in_features > 4 * self.BAND
        """only the lower triangle is summed, the upper mirrored from it when read"""
        self.mirrored = False
        """whether the upper triangle holds the lower's mirror (until the next :meth:`add`)"""
        self.outputs: dict[str, tuple[float, int]] = {}
        """each Linear reading these inputs: the sum of its squared outputs on them (its bias taken off), and its
        output features"""

    def add(self, inputs: torch.Tensor) -> None:
        x = inputs.detach().reshape(-1, inputs.shape[-1])
        if x.shape[0] == 0:
            return
        if self.sum.device != x.device:
            self.sum = self.sum.to(x.device)
        self.rows += x.shape[0]
        self.mirrored = False
        # a bf16 model's activations are exact in bf16, and the matmul sums their products in fp32: only each
        # product is rounded (to 8 bits), then added here in fp32. Several times faster on CPUs with bf16 units, with
        # GPTQ's error unchanged (measured in benchmarks/results/real_llm.md); emulated, and slower, on the others
        if x.dtype != torch.bfloat16 or not bf16_products_fast(x.device.type):
            x = x.float()
        if not self.banded:
            _add_product(self.sum, x.T, x)
            return
        # a wide layer's (a down projection's thousands of inputs): the lower triangle, band by band, each band's
        # product from contiguous rows of X^T. Half the products of X^T X, and several times faster than one product
        # (benchmarks/results/scale.md, "Calibrated INT4 at the Qwen2.5-1.5B shape")
        xt = x.T.contiguous()
        for start in range(0, x.shape[1], self.BAND):
            _add_product(self.sum[start:, start:start + self.BAND], xt[start:], x[:, start:start + self.BAND])

    @property
    def wants_outputs(self) -> bool:
        """Whether :meth:`add_output` should be given the outputs of the Linears reading these inputs: for a wide
        layer, where summing them (each output once) costs far less than the product of the weight with ``H``
        (``N * K^2``); a narrow one's product costs about what the outputs' sum does."""
        return self.banded

    def add_output(self, source: str, outputs: torch.Tensor, bias: torch.Tensor | None) -> None:
        """What the Linear ``source`` gave on the rows :meth:`add` took last (``[..., N]``, in the forward that ran to
        collect them): its squared outputs summed, toward ``tr(W H W^T)`` (:meth:`output_energy`)."""
        y = outputs.detach()
        if bias is not None:
            y = y - bias.detach().to(y.dtype)
        energy = float(torch.linalg.vector_norm(y, dtype=torch.float32)) ** 2
        before = self.outputs.get(source, (0.0, y.shape[-1]))[0]
        self.outputs[source] = (before + energy, y.shape[-1])

    def output_energy(self, rows: int) -> float | None:
        """``tr(W H W^T)`` of the weight ``W`` that stacks the rows of every Linear that read these inputs (``rows``
        output features in all), from their outputs: one product of ``W`` with ``H`` fewer. None where the outputs
        seen are not those of ``rows`` features (no forward hook, or the stack split by group size)."""
        if not self.outputs or sum(width for _, width in self.outputs.values()) != rows:
            return None
        return sum(energy for energy, _ in self.outputs.values()) * 2.0 / max(self.rows, 1)

    @property
    def matrix(self) -> torch.Tensor:
        scale = 2.0 / max(self.rows, 1)
        if self.banded and not self.mirrored:
            # below the diagonal blocks the sum holds X^T X, above them zeros, and each diagonal block is whole: each
            # band's rows right of its block take the transpose of the band below it, in place (no second matrix),
            # and each diagonal block the mean of itself and its transpose
            for start in range(0, self.sum.shape[0], self.BAND):
                end = start + self.BAND
                self.sum[start:end, end:].copy_(self.sum[end:, start:end].T)
                block = self.sum[start:end, start:end]
                block.copy_(block.T + block).mul_(0.5)
            self.mirrored = True
        return self.sum * scale


def _add_product(into: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> None:
    """``into += a @ b`` in float32; bf16 operands multiplied in bf16 (fp32 sums inside, the product rounded once)."""
    if a.dtype == torch.bfloat16:
        into.add_(a @ b)
    else:
        into.addmm_(a, b)


PANEL = 512
"""columns the factorization takes at a time (:func:`_hessian_factor`)"""
MAX_DAMPING = 10 ** 5
"""the most the damping is raised, as a multiple of ``damp``, before a Hessian is given up as not definite"""


def _hessian_factor(reversed_h: torch.Tensor, damp: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The lower Cholesky factor ``L`` of ``J (H + D) J``, ``J`` the reversal of the order, and the damping ``D``
    it took (its diagonal, in ``L``'s order): ``damp * mean(diag H)``, raised tenfold on the columns from a panel
    on where the factorization meets a pivot that is not positive (a rank-deficient ``H`` comes from too few
    calibration rows; a wide one summed from bfloat16 products can be slightly indefinite).
    ``H + D = A^T A`` with ``A = J L^T J`` lower triangular: see :class:`_Reach`. ``reversed_h`` is ``J H J``,
    which this function overwrites with ``L``.

    A Hessian wider than ``4 * PANEL`` is factored left-looking, :data:`PANEL` columns at a time: each panel takes
    the product of the factor's rows before it, then its own factorization and a triangular solve for the rows
    below. The factor's columns before a panel read nothing of the diagonal from the panel on, so a raise there
    repeats that panel's small factorization only, where a whole factorization again took as long as the first
    (benchmarks/results/scale.md, "Calibrated INT4 at the Qwen2.5-1.5B shape"). A narrower one is one panel, damped
    alike throughout: factoring it again costs little."""
    cols = reversed_h.shape[0]
    mean = float(torch.mean(torch.diagonal(reversed_h).flip(0)))  # summed in the columns' order
    lam = torch.full((cols,), damp * mean, dtype=torch.float64)
    a = reversed_h
    a.diagonal().add_(damp * mean)
    panel = PANEL if cols > 4 * PANEL else cols
    raised = 0  # the columns from the current panel on are damped by damp * 10 ** raised * mean
    for start in range(0, cols, panel):
        end = min(start + panel, cols)
        if start:
            a[start:, start:end].addmm_(a[start:, :start], a[start:end, :start].T, alpha=-1)
        factor, info = torch.linalg.cholesky_ex(a[start:end, start:end])
        while int(info):
            if 10 ** (raised + 1) > MAX_DAMPING:
                raise torch.linalg.LinAlgError(f"the Hessian is not positive definite even with {MAX_DAMPING}x "
                                               "damping")
            before, raised = damp * 10 ** raised * mean, raised + 1
            lam[start:] = damp * 10 ** raised * mean
            a.diagonal()[start:].add_(float(lam[start]) - before)
            factor, info = torch.linalg.cholesky_ex(a[start:end, start:end])
        a[start:end, start:end] = factor
        if end < cols:
            a[end:, start:end] = torch.linalg.solve_triangular(factor.T, a[end:, start:end], upper=True, left=False)
    return a.tril_(), lam


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

    def keep(self, start: int, errors: torch.Tensor) -> None:
        """The errors of columns ``start`` on (``[n, N]``, in the columns' order), kept in their rows."""
        k = self.cols
        self.errors[k - start - errors.shape[0]:k - start] = errors.flip(0).to(self.errors.device)

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


@functools.cache
def _blas_threads():
    from threadpoolctl import ThreadpoolController

    return ThreadpoolController()


def _round_block(block: torch.Tensor, lower: torch.Tensor, weights: torch.Tensor, pivots: torch.Tensor,
                 codes: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor, start: int, group_size: int,
                 symmetric: bool, importance: torch.Tensor | None) -> torch.Tensor:
    """GPTQ's column loop over one lazy block, on the CPU: ``block`` ``[B, N]`` holds each column's optimal value
    given the columns before the block, ``lower`` is ``A``'s block and ``weights`` the columns' own values. Writes
    the codes and each group's grid, leaves each step's loss in ``block``, and returns the errors ``w - q``
    ``[B, N]`` in the columns' order.

    A column's value also takes the errors of the columns rounded before it in its group, as one product of their
    reach with their errors (the group's columns so far), and the block's later rows take the group's errors in
    one product where the next group starts: no rank-1 update per column. The loop runs once per input feature in
    numpy, whose calls cost a fraction of torch's at these sizes (benchmarks/results/real_llm.md, "GPTQ's column
    loop in numpy")."""
    size = block.shape[0]
    reach = (lower / torch.diagonal(lower)[:, None]).numpy()  # reach[i, j]: column j's error into column i's value
    values, own, step = block.numpy(), weights.numpy(), pivots.tolist()
    out, errors = codes.numpy(), np.zeros_like(values)
    value = np.empty(values.shape[1], dtype=values.dtype)
    first = 0  # the first column of the current group, in the block
    for i in range(size):
        col = start + i
        if col % group_size == 0:
            if i > first:  # the group before's errors into every later column of the block
                values[i:] += reach[i:, first:i] @ errors[first:i]
            first = i
            # the group's grid from its columns' optimal values given the columns rounded so far: GPTQ's updated
            # weights. values hold partial sums; the group's own triangle of A completes them
            ahead = slice(i, i + group_size)
            partial = (block[ahead] - weights[ahead]).mul_(pivots[ahead, None])
            best = torch.linalg.solve_triangular(lower[ahead, ahead], partial, upper=False)
            best = best.add_(weights[ahead]).T
            if importance is None:
                scale, zero = grid(best, symmetric)
            else:  # each column's error weighted by its input's mean square, the Hessian's diagonal
                scale, zero = weighted_grid(best, importance[ahead], symmetric=symmetric)
            scales[col // group_size], zeros[col // group_size] = scale, zero
            scale, zero = scales[col // group_size].numpy(), zeros[col // group_size].numpy()
        column, code, err = values[i], out[i], errors[i]
        if i > first:
            np.add(column, np.dot(reach[i, first:i], errors[first:i], out=value), out=column)
        np.divide(column, scale, out=code)
        np.rint(code, out=code)
        np.add(code, zero, out=code)
        np.maximum(code, 0, out=code)
        np.minimum(code, MAXQ, out=code)
        np.subtract(code, zero, out=value)
        np.multiply(value, scale, out=value)  # the column's rounded value
        np.subtract(own[i], value, out=err)
        np.subtract(column, value, out=column)
        np.multiply(column, step[i], out=column)  # the step's loss
    return torch.from_numpy(errors)


def gptq_quantize(weight: torch.Tensor, hessian: torch.Tensor, group_size: int, symmetric: bool, *,
                  damp: float = 0.01, act_order: bool = False, block_size: int = 128,
                  group_order: bool = True, grid_search: GridName = "search") -> Int4Weight:
    """GPTQ (Algorithm 1 with lazy batches) of ``weight`` ``[N, K]`` under ``hessian`` ``[K, K]``."""
    return gptq_with_error(weight, hessian, group_size, symmetric, damp, act_order, block_size, group_order,
                           grid_search)[0]


def gptq_with_error(weight: torch.Tensor, hessian: torch.Tensor, group_size: int, symmetric: bool, damp: float,
                    act_order: bool, block_size: int, group_order: bool,
                    grid_search: GridName = "search") -> tuple[Int4Weight, float]:
    """:func:`gptq_quantize`, and the output error ``tr(E H E^T)`` of the rounding, ``E = W - Q``. ``group_order``
    (without ``act_order``) takes the columns in :func:`_groups_by_importance`'s order. ``grid_search``: each
    group's grid minimizes its rounding error weighted by the Hessian's diagonal (``grid_search.weighted_grid``,
    taken from GPTQ's updated weights as the group starts), or ``minmax``: the group's min and max.

    Each step's loss ``err^2`` is what fixing that column adds to the error under the damped Hessian
    ``H + D`` (the rest of the row then optimal, ``D`` the damping), so their sum is ``tr(E (H + D) E^T)``: less
    ``tr(E D E^T)``, the error under ``H``. One product of ``E`` with ``H`` fewer than computing it again."""
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
        backwards = perm.flip(0)
        # one gather of both dims: the rows' gather, then the columns', took nearly twice as long on a wide H
        reversed_h = h[backwards[:, None], backwards]
        reversed_h.diagonal().copy_(diagonal[backwards])
    else:
        reversed_h = h.flip(0, 1)
        reversed_h.diagonal().copy_(diagonal.flip(0))
    lower, lam = _hessian_factor(reversed_h, damp)
    reach = _Reach(lower, rows)

    # columns as rows ([K, N]), in the order GPTQ rounds them: each column it rounds is contiguous
    wt = w.T.contiguous()
    importance = None if grid_search == "minmax" else diagonal if perm is None else diagonal[perm]
    if perm is not None:
        wt = wt[perm]
    groups = cols // group_size
    scales = torch.zeros(groups, rows, dtype=dtype)
    zeros = torch.zeros(groups, rows, dtype=dtype)
    codes = torch.zeros(cols, rows, dtype=dtype)
    damped = 0.0
    block_size = -(-max(block_size, group_size) // group_size) * group_size  # whole groups in each block
    # the column loop's small products on one of numpy's BLAS threads: its threads and torch's wait on the same cores
    # by spinning, and each took 2-4x longer beside the other
    with _blas_threads().limit(limits=1, user_api="blas"):
        for start in range(0, cols, block_size):
            end = min(start + block_size, cols)
            # each column's optimal value given every column before the block: one product a block (lazy updates)
            block = reach.carried(start, end, start).add_(wt[start:end]).cpu()
            gone = _round_block(block, reach.block(start, end).cpu(), wt[start:end].cpu(),
                                reach.pivots[start:end].cpu(), codes[start:end], scales, zeros, start, group_size,
                                symmetric, None if importance is None else importance[start:end].cpu())
            damped += float(block.square().sum(dtype=torch.float64))  # block now holds each step's loss
            reach.keep(start, gone)
    g_idx = None
    if perm is not None:  # back to the weight's own order: the codes' rows (columns) gathered before the transpose
        inverse = torch.argsort(perm).cpu()
        codes = codes[inverse]
    codes, scales, zeros = codes.T, scales.T, zeros.T  # written on the CPU by the column loop
    if perm is not None:
        if group_perm is None:  # act-order: each column names its group
            g_idx = (torch.arange(cols) // group_size)[inverse]
        else:  # whole groups: scales and zeros back in the groups' own order
            back = torch.argsort(group_perm).cpu()
            scales, zeros = scales[:, back], zeros[:, back]
    packed = Int4Weight.from_codes(codes, scales, zeros, group_size, symmetric, g_idx=g_idx)
    # tr(E D E^T) from the errors kept as the columns were rounded (the weight with its dead columns zeroed, H has
    # no row for them, less its rounded values, as the packed weight dequantizes them), each column's squared
    # errors times its damping: both in reversed order
    if bool((lam == lam[0]).all()):  # damped alike throughout
        spread = float(lam[0]) * float(reach.errors.square().sum(dtype=torch.float64))
    else:
        spread = float((reach.errors.square().sum(dim=1, dtype=torch.float64) * lam.to(reach.errors.device)).sum())
    return packed, max(damped - spread, 0.0)


def _quantize(weight: torch.Tensor, hessian: Hessian, config: GPTQConfig) -> Quantized:
    matrix = hessian.matrix
    packed, absolute = gptq_with_error(weight, matrix, config.group_size, config.symmetric, config.damp,
                                       config.act_order, config.block_size, config.group_order, config.grid)
    # a wide layer's tr(W H W^T) from its outputs in the forward that collected H (Hessian.add_output)
    relative = relative_error(absolute, weight.detach().float().cpu(), matrix.cpu(),
                              hessian.output_energy(weight.shape[0]))
    return Quantized(packed, relative, output_error=absolute)


HANDLER = register(Int4Method(GPTQConfig, _quantize, lambda config, in_features: Hessian(in_features), stacks=True))
