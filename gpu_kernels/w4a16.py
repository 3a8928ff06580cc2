"""W4A16 dequantize-GEMM: ``y = x @ W.T + b`` with ``W`` held as 4-bit codes in the kernel layout.

``x`` is float16 or bfloat16 ``[..., K]``; ``W[n, k] = (code(n, k) - zeros[n, G(k)]) * scales[n, G(k)]``
with ``qweight`` uint8 ``[N, K // 2]`` in the layout of :mod:`infopt.kernels.w4a16_layout` (the
halves of each group split across the nibbles; act-order as a permutation ``perm`` of the input
features), ``scales`` float ``[N, K // g]`` and ``zeros`` uint8 ``[N, K // g]``.

**The kernel** computes ``y.T`` tile by tile: one program per ``BLOCK_N`` output features,
``BLOCK_M`` rows of ``x`` and one of ``SPLIT_K`` runs of ``K``'s groups. Split-K is what gives a
decoding-shaped problem enough bytes in flight: whole-``K`` programs read the weight at a smaller share of the
copy bandwidth than programs split over 2 to 16 runs of ``K`` (measured on an H100 with
``benchmarks/tune_w4a16.py``; benchmarks/results/rules.md). The output is zeroed first and each program adds
its part with an atomic add in ``x.dtype`` (one kernel after the zeroing, no fp32 partials, no epilogue op). So the parts are summed in no
fixed order, two runs can differ in the last bit, and each part is rounded to ``x.dtype`` before it
is added: the max error to the fp32 result measured up to 3.7x torch fp16's and 2.5x torch bf16's on
the same weight (``benchmarks/results/w4a16.md``). For each group a program loads the group's
``g / 2`` bytes per row (contiguous), and for each half:

- the codes become exact fp16/bf16 integers without an integer-to-float conversion: ``code | 0x6400``
  read as fp16 is ``1024 + code`` (``0x4300``, bf16: ``128 + code``), and one subtraction of
  ``1024 + zero`` gives ``code - zero``;
- one tensor-core product of the ``[BLOCK_N, g/2]`` integer tile with ``x``'s ``[g/2, BLOCK_M]``
  slice, accumulated in fp32;

then the group's two products are scaled once per output (``acc += s * (P_lo + P_hi)``) instead of
once per weight. The weight tile is the left operand (``W @ x.T``), which Hopper's warpgroup MMA
may take from registers where it was dequantized. The bias is added in fp32 by the first split.
Tiles, groups per loop step, splits, warps and stages are autotuned per ``(M bucket, N, K)``: one
set of configs for ``M <= 16`` (decoding; ``BLOCK_M = 16``, the tensor core's least) and one above.

**Calls.** ``torch.ops.infopt.w4a16_linear`` (defined on first use, :func:`registered`) is a ``triton_op``:
``torch.compile`` and AOTInductor see the Triton kernel itself and put it into the compiled code (no call back into Python at run
time). On eager CUDA tensors :func:`w4a16_linear` skips the dispatcher and launches directly, a
repeat call through the compiled kernel its first call got (:mod:`infopt.kernels.launcher`); the op
checks nothing per call beyond what torch does, so shapes are checked once, where the weight is put
into the kernel layout (:class:`W4A16Linear`, the ``int4_kernels`` pass) and by the op's fake
(trace-time) implementation. Off CUDA the op runs :func:`w4a16_linear_torch`, the reference.

Under ``TRITON_INTERPRET=1`` (set before triton is imported) the launcher also runs on CPU tensors
with one small fixed config; there ``tl.dot`` on bfloat16 is computed in fp32 (the interpreter
multiplies bfloat16 bit patterns as integers), on operands that are exact small integers either way.
"""

from __future__ import annotations

import functools

import torch
from torch import nn

from infopt.kernels.launcher import Relauncher, specialization
from infopt.kernels.w4a16_layout import from_kernel_layout, to_kernel_layout, unsupported
from infopt.quantize.int4_format import Int4Linear, int4_linear_torch, replace_module

try:
    import triton
    import triton.language as tl
except ImportError:
    triton = tl = None

SMALL_M = 16
"""Largest ``M`` the decoding configs are tuned for (one 16-row tile)."""
ACTIVATION_DTYPES = (torch.float16, torch.bfloat16)


def _jit(fn):
    return fn if triton is None else triton.jit(fn)


@_jit
def _exact_codes(nibbles, zero, ACT: tl.constexpr, DOT: tl.constexpr):
    """``code - zero`` as exact integers in ``DOT`` (``zero`` is ``[BLOCK_N]``): the bits
    ``magic | code`` read as ``ACT`` are the number ``magic + code``."""
    if ACT == tl.float16:
        biased = (nibbles.to(tl.uint16) | 0x6400).to(tl.float16, bitcast=True)
        return biased.to(DOT) - (zero + 1024.0)[:, None]
    else:
        biased = (nibbles.to(tl.uint16) | 0x4300).to(tl.bfloat16, bitcast=True)
        return biased.to(DOT) - (zero + 128.0)[:, None]


@_jit
def _w4a16_kernel(x_ptr, qw_ptr, scales_ptr, zeros_ptr, perm_ptr, bias_ptr, out_ptr, M, N, K, stride_qn, stride_xm, M_BUCKET,
                  GROUP: tl.constexpr, HALF: tl.constexpr, HAS_PERM: tl.constexpr, HAS_BIAS: tl.constexpr, DOT_FP32: tl.constexpr,
                  BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr, GROUPS_PER_STEP: tl.constexpr, SPLIT_K: tl.constexpr):
    """Program ``(n, m, s)``: ``y[m-tile, n-tile] = (W[n-tile] @ x[m-tile].T).T`` over the ``s``-th of
    ``SPLIT_K`` runs of ``K``'s groups (stored with ``SPLIT_K = 1``, else added into a zeroed ``y``)."""
    act = x_ptr.dtype.element_ty
    dot = tl.float32 if DOT_FP32 else act
    offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_h = tl.arange(0, HALF)
    n_mask = offs_n < N
    m_mask = offs_m < M
    split = tl.program_id(2)
    groups = K // GROUP
    per_split = tl.cdiv(groups, SPLIT_K)
    begin = split * per_split
    end = tl.minimum(begin + per_split, groups)
    qw_rows = qw_ptr + offs_n[:, None].to(tl.int64) * stride_qn
    x_cols = x_ptr + offs_m[None, :].to(tl.int64) * stride_xm
    group_at = offs_n.to(tl.int64) * groups
    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    for first in range(begin, end, GROUPS_PER_STEP):
        for step in tl.static_range(GROUPS_PER_STEP):
            group = first + step
            k_lo = group * GROUP + offs_h
            k_hi = k_lo + HALF
            live_k = tl.zeros_like(offs_h) + group < end
            live_n = n_mask & (tl.zeros_like(offs_n) + group < end)
            packed = tl.load(qw_rows + group * HALF + offs_h[None, :], mask=n_mask[:, None] & live_k[None, :], other=0)
            zero = tl.load(zeros_ptr + group_at + group, mask=live_n, other=0).to(dot)
            scale = tl.load(scales_ptr + group_at + group, mask=live_n, other=0.0).to(tl.float32)
            if HAS_PERM:
                k_lo = tl.load(perm_ptr + k_lo, mask=live_k, other=0)
                k_hi = tl.load(perm_ptr + k_hi, mask=live_k, other=0)
            x_mask = live_k[:, None] & m_mask[None, :]
            x_lo = tl.load(x_cols + k_lo[:, None], mask=x_mask, other=0.0).to(dot)
            x_hi = tl.load(x_cols + k_hi[:, None], mask=x_mask, other=0.0).to(dot)
            part = tl.dot(_exact_codes(packed & 0xF, zero, act, dot), x_lo)
            part = tl.dot(_exact_codes(packed >> 4, zero, act, dot), x_hi, part)
            acc += part * scale[:, None]
    if HAS_BIAS:
        acc += tl.load(bias_ptr + offs_n, mask=n_mask & (tl.zeros_like(offs_n) + split == 0), other=0.0).to(tl.float32)[:, None]
    out = out_ptr + offs_m[None, :].to(tl.int64) * N + offs_n[:, None]
    if SPLIT_K == 1:
        tl.store(out, acc.to(act), mask=n_mask[:, None] & m_mask[None, :])
    else:
        tl.atomic_add(out, acc.to(act), mask=n_mask[:, None] & m_mask[None, :], sem="relaxed")


def interpreting() -> bool:
    """True when the kernel was built for Triton's CPU interpreter (``TRITON_INTERPRET=1`` when
    triton was imported; setting it later changes nothing)."""
    if triton is None:
        return False
    from triton.runtime.interpreter import InterpretedFunction

    return isinstance(_w4a16_kernel, InterpretedFunction)


INTERPRETER_CONFIG = dict(BLOCK_N=16, BLOCK_M=16, GROUPS_PER_STEP=2, SPLIT_K=1, num_warps=4, num_stages=1)

DECODE_CONFIGS = [  # (BLOCK_N, GROUPS_PER_STEP, SPLIT_K, warps, stages); BLOCK_M = 16
    (64, 2, 2, 4, 3), (64, 2, 4, 4, 3), (64, 2, 8, 4, 3), (64, 2, 16, 4, 3), (64, 1, 8, 4, 4), (128, 1, 4, 8, 4),
    (128, 1, 8, 8, 4), (32, 2, 8, 4, 3),
]
GEMM_CONFIGS = [  # (BLOCK_N, BLOCK_M, GROUPS_PER_STEP, SPLIT_K, warps, stages)
    (64, 32, 1, 4, 4, 3), (64, 64, 1, 2, 4, 3), (64, 64, 1, 4, 4, 3), (128, 64, 1, 4, 8, 3), (64, 128, 1, 2, 4, 3),
    (64, 128, 1, 4, 4, 3), (128, 128, 1, 2, 8, 3), (128, 128, 1, 1, 8, 3),
]
"""Chosen from ``benchmarks/tune_w4a16.py`` on an H100 (benchmarks/results/rules.md): the fastest configs at M = 1, 16,
64 and 256 on Llama-7B's layer shapes split ``K`` over 2 to 16 programs per output tile."""


def kernel_configs(small_m: bool) -> list[dict]:
    """The tile configs autotuned over, for ``M <= 16`` or above; the key is ``(M_BUCKET, N, K)``."""
    if small_m:
        return [dict(BLOCK_N=n, BLOCK_M=SMALL_M, GROUPS_PER_STEP=s, SPLIT_K=k, num_warps=w, num_stages=st)
                for n, s, k, w, st in DECODE_CONFIGS]
    return [dict(BLOCK_N=n, BLOCK_M=m, GROUPS_PER_STEP=s, SPLIT_K=k, num_warps=w, num_stages=st)
            for n, m, s, k, w, st in GEMM_CONFIGS]


def _autotuned(small_m: bool):
    configs = []
    for config in kernel_configs(small_m):
        meta = dict(config)
        warps, stages = meta.pop("num_warps"), meta.pop("num_stages")
        configs.append(triton.Config(meta, num_warps=warps, num_stages=stages))
    # a split-K config adds into y: the autotuner zeroes it before each trial and before the chosen run
    return triton.autotune(configs=configs, key=["M_BUCKET", "N", "K"], reset_to_zero=["out_ptr"])(_w4a16_kernel)


_INTERPRETING = interpreting()
if triton is not None and not _INTERPRETING:
    _DECODE = _autotuned(small_m=True)
    _GEMM = _autotuned(small_m=False)
    _RELAUNCH = {True: Relauncher(_DECODE), False: Relauncher(_GEMM)}


def _hint(size) -> int:
    """A plain int for ``size``, which is symbolic while torch.compile or AOTInductor traces the op:
    only a tuning choice depends on it (every config computes every ``M``), so no guard is added."""
    if isinstance(size, int):
        return size
    from torch.fx.experimental import symbolic_shapes

    for name in ("optimization_hint", "hint_int"):  # renamed between torch releases
        hint = getattr(symbolic_shapes, name, None)
        if hint is not None:
            try:
                return int(hint(size, fallback=SMALL_M))
            except TypeError:
                return int(hint(size))
    return SMALL_M


def _bucket(m: int) -> int:
    return 1 << max(m - 1, 0).bit_length()


def _launch(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor,
            perm: torch.Tensor | None, bias: torch.Tensor | None, group_size: int, kernel_wrapper) -> torch.Tensor:
    """Allocate ``y [..., N]`` and launch; nothing is checked here (see the module docstring)."""
    N, K = qweight.shape[0], x.shape[-1]
    x2 = x if x.dim() == 2 else x.reshape(-1, K)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    M = x2.shape[0]
    # zeroed: a split-K tile adds its part of the sum into y (every GPU config may split K)
    out = (torch.empty if _INTERPRETING else torch.zeros)((M, N), dtype=x.dtype, device=x.device)
    flags = dict(GROUP=group_size, HALF=group_size // 2, HAS_PERM=perm is not None, HAS_BIAS=bias is not None,
                 DOT_FP32=_INTERPRETING and x.dtype == torch.bfloat16)
    m_hint = M if isinstance(M, int) else _hint(M)
    args = (x2, qweight, scales, zeros, zeros if perm is None else perm, scales if bias is None else bias, out,
            M, N, K, K // 2, x2.stride(0), _bucket(m_hint))
    if _INTERPRETING:
        config = dict(INTERPRETER_CONFIG)
        meta = {k: config.pop(k) for k in ("BLOCK_N", "BLOCK_M", "GROUPS_PER_STEP", "SPLIT_K")}
        grid = (triton.cdiv(N, meta["BLOCK_N"]), triton.cdiv(M, meta["BLOCK_M"]), meta["SPLIT_K"])
        _w4a16_kernel[grid](*args, **flags, **meta, **config)
        return out if x.dim() == 2 else out.reshape(*x.shape[:-1], N)

    def grid(meta):
        return triton.cdiv(N, meta["BLOCK_N"]), triton.cdiv(M, meta["BLOCK_M"]), meta["SPLIT_K"]

    small = m_hint <= SMALL_M
    if kernel_wrapper is _direct:
        key = (x.device.index, args[-1], N, K, *flags.values(), specialization(args))  # args[-1]: M_BUCKET
        _RELAUNCH[small](key, grid, args, flags)
    else:
        kernel_wrapper(_DECODE if small else _GEMM)[grid](*args, **flags)
    return out if x.dim() == 2 else out.reshape(*x.shape[:-1], N)


def _direct(kernel):
    return kernel


def w4a16_linear_triton(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor,
                        perm: torch.Tensor | None, bias: torch.Tensor | None, group_size: int) -> torch.Tensor:
    """The Triton launcher, with the arguments checked first (:func:`check_inputs`)."""
    if triton is None:
        raise RuntimeError("w4a16_linear_triton needs triton, which is not installed")
    check_inputs(x, qweight, scales, zeros, perm, bias, group_size)
    return _launch(x, qweight, scales, zeros, perm, bias, group_size, _direct)


def check_inputs(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor,
                 perm: torch.Tensor | None, bias: torch.Tensor | None, group_size: int) -> None:
    """Raise ValueError naming the first argument whose dtype, shape or device the kernel cannot take.
    The values of ``perm`` are not read (that would wait for the GPU): each must be in ``[0, K)``."""
    if x.dtype not in ACTIVATION_DTYPES:
        raise ValueError(f"w4a16_linear: x must be float16 or bfloat16, got {x.dtype}")
    if x.dim() < 1:
        raise ValueError("w4a16_linear: x must have at least one dimension (its last is K)")
    K = x.shape[-1]
    if qweight.dtype != torch.uint8 or qweight.dim() != 2:
        raise ValueError(f"w4a16_linear: qweight must be a 2-D uint8 tensor [N, K // 2], got {qweight.dtype} "
                         f"{list(qweight.shape)}")
    N = qweight.shape[0]
    if qweight.shape[1] * 2 != K:
        raise ValueError(f"w4a16_linear: K mismatch: x has K={K} input features but qweight "
                         f"{list(qweight.shape)} packs K={qweight.shape[1] * 2}")
    reason = unsupported(K, group_size, None)
    if reason:
        raise ValueError(f"w4a16_linear: {reason}")
    groups = [N, K // group_size]
    if not scales.is_floating_point() or list(scales.shape) != groups:
        raise ValueError(f"w4a16_linear: scales must be a float tensor {groups}, got {scales.dtype} "
                         f"{list(scales.shape)}")
    if zeros.dtype != torch.uint8 or list(zeros.shape) != groups:
        raise ValueError(f"w4a16_linear: zeros must be a uint8 tensor {groups}, got {zeros.dtype} {list(zeros.shape)}")
    if perm is not None and (perm.dtype != torch.int32 or list(perm.shape) != [K]):
        raise ValueError(f"w4a16_linear: perm must be an int32 tensor [{K}], got {perm.dtype} {list(perm.shape)}")
    if bias is not None and (not bias.is_floating_point() or list(bias.shape) != [N]):
        raise ValueError(f"w4a16_linear: bias must be a float tensor [{N}], got {bias.dtype} {list(bias.shape)}")
    tensors = [t for t in (x, qweight, scales, zeros, perm, bias) if t is not None]
    if len({t.device for t in tensors}) > 1:
        devices = sorted({str(t.device) for t in tensors})
        raise ValueError(f"w4a16_linear: all tensors must be on one device, got {devices}")
    for name, t in (("qweight", qweight), ("scales", scales), ("zeros", zeros), ("perm", perm)):
        if t is not None and not t.is_contiguous():
            raise ValueError(f"w4a16_linear: {name} must be contiguous")
    if x.device.type not in ("cuda", "meta") and not interpreting():
        raise ValueError(f"w4a16_linear: the Triton kernel needs CUDA tensors, got {x.device} "
                         "(or set TRITON_INTERPRET=1 before triton is imported to run it on CPU)")


def w4a16_linear_torch(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor,
                       perm: torch.Tensor | None, bias: torch.Tensor | None, group_size: int) -> torch.Tensor:
    """The reference: the weight back in the packed format, ``y = x @ W.T + b`` in fp32 from the
    exactly dequantized ``W``, rounded once to ``x.dtype``."""
    packed, g_idx = from_kernel_layout(qweight, perm, group_size)
    return int4_linear_torch(x.float(), packed, scales, zeros, g_idx, bias, group_size).to(x.dtype)


def _reference_kernel(x, qweight, scales, zeros, perm, bias, group_size):
    return w4a16_linear_torch(x, qweight, scales, zeros, perm, bias, group_size)


@functools.cache
def registered():
    """``torch.ops.infopt.w4a16_linear``, defined on first use: a ``triton_op``'s definition imports
    ``torch._inductor`` (1.5 s), which a build that never swaps in the kernel (every CPU build) does not pay."""
    if triton is not None:
        @torch.library.triton_op("infopt::w4a16_linear", mutates_args=())
        def op(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor,
               perm: torch.Tensor | None, bias: torch.Tensor | None, group_size: int) -> torch.Tensor:
            """``x @ W.T + bias`` for a weight in the kernel layout: the Triton kernel for float16/bfloat16
            ``x`` on CUDA, the reference for any other dtype or device (this body is also what a compiler
            traces, with fake tensors)."""
            if x.dtype not in ACTIVATION_DTYPES or x.device.type != "cuda":
                return w4a16_linear_torch(x, qweight, scales, zeros, perm, bias, group_size)
            return _launch(x, qweight, scales, zeros, perm, bias, group_size, torch.library.wrap_triton)
    else:
        @torch.library.custom_op("infopt::w4a16_linear", mutates_args=())
        def op(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor,
               perm: torch.Tensor | None, bias: torch.Tensor | None, group_size: int) -> torch.Tensor:
            """``x @ W.T + bias`` for a weight in the kernel layout (triton is not installed: the reference)."""
            return w4a16_linear_torch(x, qweight, scales, zeros, perm, bias, group_size)

    op.register_kernel("cpu")(_reference_kernel)
    op.register_fake(_fake)
    return torch.ops.infopt.w4a16_linear


def _fake(x, qweight, scales, zeros, perm, bias, group_size):
    if x.dtype in ACTIVATION_DTYPES:
        check_inputs(x, qweight, scales, zeros, perm, bias, group_size)
    return x.new_empty((*x.shape[:-1], qweight.shape[0]))


def _launches_directly(x: torch.Tensor) -> bool:
    """An eager call on real CUDA tensors, outside any tracing, with no gradient to record."""
    return (x.is_cuda and type(x) is torch.Tensor and x.dtype in ACTIVATION_DTYPES and not x.requires_grad
            and triton is not None and not torch.compiler.is_compiling())


def w4a16_linear(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor,
                 perm: torch.Tensor | None = None, bias: torch.Tensor | None = None,
                 group_size: int = 128) -> torch.Tensor:
    """``x @ W.T + bias`` for a weight in the kernel layout: launched directly on eager CUDA tensors,
    else through ``torch.ops.infopt.w4a16_linear`` (traced, compiled, or the reference off CUDA)."""
    if _launches_directly(x):
        return _launch(x, qweight, scales, zeros, perm, bias, group_size, _direct)
    if not torch.compiler.is_compiling():
        registered()  # a compiler traces through the cache into the op's definition, which it refuses
    return torch.ops.infopt.w4a16_linear(x, qweight, scales, zeros, perm, bias, group_size)


class W4A16Linear(nn.Module):
    """An :class:`Int4Linear` with its weight in the kernel layout, computing with the W4A16 kernel
    (on CUDA, for float16/bfloat16 inputs; the reference elsewhere)."""

    def __init__(self, qweight: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor, perm: torch.Tensor | None,
                 bias: torch.Tensor | None, group_size: int, input_scale: torch.Tensor | None = None):
        super().__init__()
        registered()  # defined before any compiler traces this layer
        self.in_features = int(qweight.shape[1] * 2)
        self.out_features = int(qweight.shape[0])
        self.group_size = group_size
        for name, value in (("qweight", qweight), ("scales", scales), ("zeros", zeros), ("perm", perm),
                            ("bias", bias), ("input_scale", input_scale)):
            self.register_buffer(name, None if value is None else value.contiguous())

    @classmethod
    def from_int4(cls, layer: Int4Linear) -> "W4A16Linear":
        """The same layer in the kernel layout; ValueError saying why when it does not fit."""
        reason = unsupported(layer.in_features, layer.group_size, layer.g_idx)
        if reason:
            raise ValueError(reason)
        qweight, perm = to_kernel_layout(layer.qweight, layer.g_idx, layer.group_size)
        return cls(qweight, layer.scales, layer.zeros, perm, layer.bias, layer.group_size, layer.input_scale)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.input_scale is not None:
            x = x / self.input_scale.to(x.dtype)
        return w4a16_linear(x, self.qweight, self.scales, self.zeros, self.perm, self.bias, self.group_size)

    def extra_repr(self) -> str:
        order = ", act-order" if self.perm is not None else ""
        return f"in_features={self.in_features}, out_features={self.out_features}, group_size={self.group_size}{order}"


def use_w4a16_kernels(model: nn.Module) -> dict[str, str]:
    """Swap each :class:`Int4Linear` of ``model`` for a :class:`W4A16Linear` in place; returns the
    layers kept as they were, with why."""
    kept = {}
    for name, module in list(model.named_modules()):
        if isinstance(module, Int4Linear):
            try:
                replace_module(model, name, W4A16Linear.from_int4(module))
            except ValueError as exc:
                kept[name] = str(exc)
    return kept
