"""W4A16 dequantize-GEMM: ``y = x @ W.T + b`` with ``W`` in infopt's packed INT4 format.

``x`` is float16 or bfloat16 ``[..., K]``; ``W[n, k] = (code(n, k) - zeros[n, G(k)]) * scales[n, G(k)]``
is held as ``qweight`` uint8 ``[N, K // 2]`` (low nibble = even ``k``), ``scales`` ``[N, K // g]``,
``zeros`` uint8 ``[N, K // g]`` and an optional act-order ``g_idx`` int32 ``[K]`` (see
:mod:`infopt.quantize.int4_format`). The kernel reads each weight tile once as 4-bit codes, dequantizes
it in registers (fp32 ``(code - zero) * scale``, rounded to the activation dtype), multiplies on the
tensor cores with fp32 accumulation and writes ``y`` in the activation dtype, bias added in fp32.

Two variants share the tile dequantizer :func:`_dequant_tile`:

- ``gemm`` (``M > 16``, ``M`` = rows of ``x`` over its leading dims): one program per
  ``BLOCK_M x BLOCK_N`` output tile, grouped launch order for L2 reuse (Triton tutorial
  ``03-matrix-multiplication.py``), autotuned tiles of 32-128 rows, 64-256 columns, 64-128 of ``K``.
- ``splitk`` (``M <= 16``, decoding): a 16-row tile, and the ``K`` loop split over ``SPLIT_K``
  programs so that a GEMV-shaped problem with few output tiles still fills every SM. Each split writes
  an fp32 partial ``[SPLIT_K, M, N]``; summing them in a fixed order keeps the result deterministic
  (no atomics). ``SPLIT_K`` comes from the SM count; with one split the kernel writes ``y`` directly.

Act-order is handled in the kernel: with ``g_idx`` each ``k`` of a tile loads its own group index
and gathers its scale and zero, so neither ``x`` nor the packed weight is permuted. Without ``g_idx``
and with ``group_size`` a multiple of ``BLOCK_K``, a tile lies inside one group and loads one scale
and zero per output row.

Under ``TRITON_INTERPRET=1`` (set before triton is imported) the launcher also runs on CPU tensors
with one small fixed config; there ``tl.dot`` on bfloat16 is computed in fp32 (the interpreter
multiplies bfloat16 bit patterns as integers), on operands first rounded to bfloat16 as on a GPU.
"""

from __future__ import annotations

import logging
from typing import Literal

import torch

from infopt.quantize.int4_format import int4_linear_torch

try:
    import triton
    import triton.language as tl
except ImportError:
    triton = tl = None

log = logging.getLogger(__name__)

SMALL_M = 16
"""Largest ``M`` the split-K variant is chosen for."""
SPLIT_UNIT = 256
"""``K`` per split is a multiple of this, so every ``BLOCK_K`` in the configs divides it."""
ACTIVATION_DTYPES = (torch.float16, torch.bfloat16)
Variant = Literal["auto", "gemm", "splitk"]


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _jit(fn):
    return fn if triton is None else triton.jit(fn)


@_jit
def _dequant_tile(qw_ptr, scales_ptr, zeros_ptr, gidx_ptr, offs_n, k0, N, K,
                  GROUP_SIZE: tl.constexpr, HAS_GIDX: tl.constexpr, BLOCK_K: tl.constexpr,
                  ACT: tl.constexpr, DOT: tl.constexpr):
    """``W.T[k0:k0+BLOCK_K, offs_n]`` as ``[BLOCK_K, BLOCK_N]`` in ``DOT``; zero outside ``N`` rows."""
    n_groups = K // GROUP_SIZE
    n_mask = offs_n < N
    offs_b = k0 // 2 + tl.arange(0, BLOCK_K // 2)
    packed = tl.load(qw_ptr + offs_n[:, None] * (K // 2) + offs_b[None, :],
                     mask=n_mask[:, None] & (offs_b[None, :] < K // 2), other=0)
    codes = tl.interleave(packed & 0xF, packed >> 4).to(tl.float32)
    if GROUP_SIZE % BLOCK_K == 0 and not HAS_GIDX:
        at = offs_n * n_groups + k0 // GROUP_SIZE
        scale = tl.load(scales_ptr + at, mask=n_mask, other=0.0).to(tl.float32)
        zero = tl.load(zeros_ptr + at, mask=n_mask, other=0).to(tl.float32)
        weight = (codes - zero[:, None]) * scale[:, None]
    else:
        offs_k = k0 + tl.arange(0, BLOCK_K)
        k_mask = offs_k < K
        if HAS_GIDX:
            group = tl.load(gidx_ptr + offs_k, mask=k_mask, other=0)
        else:
            group = offs_k // GROUP_SIZE
        at = offs_n[:, None] * n_groups + group[None, :]
        mask = n_mask[:, None] & k_mask[None, :]
        scale = tl.load(scales_ptr + at, mask=mask, other=0.0).to(tl.float32)
        zero = tl.load(zeros_ptr + at, mask=mask, other=0).to(tl.float32)
        weight = (codes - zero) * scale
    return tl.trans(weight.to(ACT).to(DOT))


@_jit
def _x_tile(x_ptr, offs_m, k0, M, K, BLOCK_K: tl.constexpr, DOT: tl.constexpr):
    offs_k = k0 + tl.arange(0, BLOCK_K)
    mask = (offs_m[:, None] < M) & (offs_k[None, :] < K)
    return tl.load(x_ptr + offs_m[:, None].to(tl.int64) * K + offs_k[None, :], mask=mask, other=0.0).to(DOT)


@_jit
def _store(acc, out_ptr, bias_ptr, offs_m, offs_n, M, N, HAS_BIAS: tl.constexpr):
    if HAS_BIAS:
        acc = acc + tl.load(bias_ptr + offs_n, mask=offs_n < N, other=0.0).to(tl.float32)[None, :]
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    tl.store(out_ptr + offs_m[:, None].to(tl.int64) * N + offs_n[None, :], acc.to(out_ptr.dtype.element_ty), mask=mask)


@_jit
def _w4a16_gemm_kernel(x_ptr, qw_ptr, scales_ptr, zeros_ptr, gidx_ptr, bias_ptr, out_ptr, M, N, K, M_BUCKET,
                       GROUP_SIZE: tl.constexpr, HAS_GIDX: tl.constexpr, HAS_BIAS: tl.constexpr,
                       DOT_FP32: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                       BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    """One ``BLOCK_M x BLOCK_N`` tile of ``y`` per program, ``GROUP_M`` row tiles launched together."""
    act = x_ptr.dtype.element_ty
    dot = tl.float32 if DOT_FP32 else act
    pid = tl.program_id(0)
    num_m = tl.cdiv(M, BLOCK_M)
    num_n = tl.cdiv(N, BLOCK_N)
    in_group = GROUP_M * num_n
    first_m = (pid // in_group) * GROUP_M
    rows = tl.minimum(num_m - first_m, GROUP_M)
    pid_m = first_m + (pid % in_group) % rows
    pid_n = (pid % in_group) // rows
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        x = _x_tile(x_ptr, offs_m, k0, M, K, BLOCK_K, dot)
        w = _dequant_tile(qw_ptr, scales_ptr, zeros_ptr, gidx_ptr, offs_n, k0, N, K, GROUP_SIZE, HAS_GIDX,
                          BLOCK_K, act, dot)
        acc = tl.dot(x, w, acc)
    _store(acc, out_ptr, bias_ptr, offs_m, offs_n, M, N, HAS_BIAS)


@_jit
def _w4a16_splitk_kernel(x_ptr, qw_ptr, scales_ptr, zeros_ptr, gidx_ptr, bias_ptr, out_ptr, part_ptr,
                         M, N, K, K_PER_SPLIT, M_BUCKET,
                         GROUP_SIZE: tl.constexpr, HAS_GIDX: tl.constexpr, HAS_BIAS: tl.constexpr,
                         DOT_FP32: tl.constexpr, PARTIAL: tl.constexpr, BLOCK_M: tl.constexpr,
                         BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """Program ``(n, s, m)`` sums ``k`` in ``[s * K_PER_SPLIT, (s + 1) * K_PER_SPLIT)`` for one tile;
    with ``PARTIAL`` it stores the fp32 sum at ``part[s]``, else the finished ``y`` tile."""
    act = x_ptr.dtype.element_ty
    dot = tl.float32 if DOT_FP32 else act
    pid_n = tl.program_id(0)
    pid_s = tl.program_id(1)
    pid_m = tl.program_id(2)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    k_end = tl.minimum(K, (pid_s + 1) * K_PER_SPLIT)
    for k0 in range(pid_s * K_PER_SPLIT, k_end, BLOCK_K):
        x = _x_tile(x_ptr, offs_m, k0, M, K, BLOCK_K, dot)
        w = _dequant_tile(qw_ptr, scales_ptr, zeros_ptr, gidx_ptr, offs_n, k0, N, K, GROUP_SIZE, HAS_GIDX,
                          BLOCK_K, act, dot)
        acc = tl.dot(x, w, acc)
    if PARTIAL:
        mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
        at = pid_s.to(tl.int64) * M * N + offs_m[:, None].to(tl.int64) * N + offs_n[None, :]
        tl.store(part_ptr + at, acc, mask=mask)
    else:
        _store(acc, out_ptr, bias_ptr, offs_m, offs_n, M, N, HAS_BIAS)


def interpreting() -> bool:
    """True when the kernels were built for Triton's CPU interpreter (``TRITON_INTERPRET=1`` when
    triton was imported; setting it later changes nothing)."""
    if triton is None:
        return False
    from triton.runtime.interpreter import InterpretedFunction

    return isinstance(_w4a16_gemm_kernel, InterpretedFunction)


def kernel_configs(variant: Literal["gemm", "splitk"], interpret: bool) -> list[dict]:
    """Tile configs to autotune over (a single small one under the interpreter, which does not
    autotune); the autotune key is the shape ``(M_BUCKET, N, K)``, ``M_BUCKET`` = next power of 2."""
    if variant == "gemm":
        if interpret:
            return [dict(BLOCK_M=16, BLOCK_N=16, BLOCK_K=64, GROUP_M=2, num_warps=4, num_stages=1)]
        shapes = [(128, 128, 64, 8, 3), (128, 64, 64, 4, 4), (64, 128, 64, 4, 4), (64, 64, 128, 4, 3),
                  (32, 64, 128, 4, 4), (32, 128, 64, 4, 4), (64, 256, 64, 8, 3), (128, 256, 64, 8, 3)]
        return [dict(BLOCK_M=m, BLOCK_N=n, BLOCK_K=k, GROUP_M=8, num_warps=w, num_stages=s)
                for m, n, k, w, s in shapes]
    if interpret:
        return [dict(BLOCK_M=SMALL_M, BLOCK_N=16, BLOCK_K=64, num_warps=4, num_stages=1)]
    shapes = [(32, 128, 4, 4), (64, 128, 4, 4), (64, 64, 4, 4), (128, 64, 4, 3), (128, 128, 8, 3),
              (64, 128, 2, 4), (32, 256, 4, 3), (64, 256, 4, 2)]
    return [dict(BLOCK_M=SMALL_M, BLOCK_N=n, BLOCK_K=k, num_warps=w, num_stages=s) for n, k, w, s in shapes]


def split_plan(M: int, N: int, K: int, sms: int, unit: int) -> tuple[int, int]:
    """``(SPLIT_K, K_PER_SPLIT)`` giving about two programs per SM over 64-column, 16-row tiles;
    ``K_PER_SPLIT`` is a multiple of ``unit``, at most 16 splits."""
    tiles = _cdiv(N, 64) * _cdiv(M, SMALL_M)
    chunks = _cdiv(K, unit)
    split = max(1, min(_cdiv(2 * sms, tiles), chunks, 16))
    per_split = _cdiv(chunks, split) * unit
    return _cdiv(K, per_split), per_split


def _autotuned(kernel, variant: Literal["gemm", "splitk"]):
    configs = []
    for config in kernel_configs(variant, interpret=False):
        meta = dict(config)
        warps, stages = meta.pop("num_warps"), meta.pop("num_stages")
        configs.append(triton.Config(meta, num_warps=warps, num_stages=stages))
    key = ["M_BUCKET", "N", "K"] + (["K_PER_SPLIT"] if variant == "splitk" else [])
    return triton.autotune(configs=configs, key=key)(kernel)


if triton is not None:
    _gemm_tuned = _autotuned(_w4a16_gemm_kernel, "gemm")
    _splitk_tuned = _autotuned(_w4a16_splitk_kernel, "splitk")


def check_inputs(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor,
                 g_idx: torch.Tensor | None, bias: torch.Tensor | None, group_size: int) -> None:
    """Raise ValueError naming the first argument whose dtype, shape or device the kernel cannot take.
    The values of ``g_idx`` are not read (that would wait for the GPU): each must be in ``[0, K // g)``."""
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
    if group_size < 2 or group_size % 2 or K % group_size:
        raise ValueError(f"w4a16_linear: group_size {group_size} must be even and divide K={K}")
    groups = [N, K // group_size]
    if not scales.is_floating_point() or list(scales.shape) != groups:
        raise ValueError(f"w4a16_linear: scales must be a float tensor {groups}, got {scales.dtype} "
                         f"{list(scales.shape)}")
    if zeros.dtype != torch.uint8 or list(zeros.shape) != groups:
        raise ValueError(f"w4a16_linear: zeros must be a uint8 tensor {groups}, got {zeros.dtype} {list(zeros.shape)}")
    if g_idx is not None and (g_idx.dtype not in (torch.int32, torch.int64) or list(g_idx.shape) != [K]):
        raise ValueError(f"w4a16_linear: g_idx must be an int32 tensor [{K}], got {g_idx.dtype} {list(g_idx.shape)}")
    if bias is not None and (not bias.is_floating_point() or list(bias.shape) != [N]):
        raise ValueError(f"w4a16_linear: bias must be a float tensor [{N}], got {bias.dtype} {list(bias.shape)}")
    tensors = [t for t in (x, qweight, scales, zeros, g_idx, bias) if t is not None]
    if len({t.device for t in tensors}) > 1:
        devices = sorted({str(t.device) for t in tensors})
        raise ValueError(f"w4a16_linear: all tensors must be on one device, got {devices}")
    if x.device.type != "cuda" and not interpreting():
        raise ValueError(f"w4a16_linear: the Triton kernel needs CUDA tensors, got {x.device} "
                         "(or set TRITON_INTERPRET=1 before triton is imported to run it on CPU)")


def w4a16_linear_triton(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor,
                        g_idx: torch.Tensor | None, bias: torch.Tensor | None, group_size: int,
                        variant: Variant = "auto") -> torch.Tensor:
    """The Triton launcher: checks the inputs, allocates ``y [..., N]`` in ``x.dtype`` and launches
    ``splitk`` for ``M <= 16`` and ``gemm`` above (``variant`` forces one)."""
    if triton is None:
        raise RuntimeError("w4a16_linear_triton needs triton, which is not installed")
    check_inputs(x, qweight, scales, zeros, g_idx, bias, group_size)
    N, K = qweight.shape[0], x.shape[-1]
    x2 = x.reshape(-1, K).contiguous()
    M = x2.shape[0]
    out = x2.new_empty((M, N))
    if M == 0:
        return out.reshape(*x.shape[:-1], N)
    qweight, scales, zeros = qweight.contiguous(), scales.contiguous(), zeros.contiguous()
    gidx = g_idx.to(torch.int32).contiguous() if g_idx is not None else zeros
    bias_arg = bias.contiguous() if bias is not None else scales
    interpret = interpreting()
    common = dict(GROUP_SIZE=group_size, HAS_GIDX=g_idx is not None, HAS_BIAS=bias is not None,
                  DOT_FP32=interpret and x.dtype == torch.bfloat16)
    m_bucket = triton.next_power_of_2(M)
    if variant == "gemm" or (variant == "auto" and M > SMALL_M):
        def grid(c):
            return (triton.cdiv(M, c["BLOCK_M"]) * triton.cdiv(N, c["BLOCK_N"]),)

        _run("gemm", grid, (x2, qweight, scales, zeros, gidx, bias_arg, out, M, N, K, m_bucket), common, interpret)
        return out.reshape(*x.shape[:-1], N)
    if interpret:
        split, per_split = split_plan(M, N, K, sms=1, unit=kernel_configs("splitk", interpret=True)[0]["BLOCK_K"])
    else:
        sms = torch.cuda.get_device_properties(x.device).multi_processor_count
        split, per_split = split_plan(M, N, K, sms=sms, unit=SPLIT_UNIT)
    parts = x2.new_empty((split, M, N), dtype=torch.float32) if split > 1 else out

    def grid_splitk(c):
        return (triton.cdiv(N, c["BLOCK_N"]), split, triton.cdiv(M, c["BLOCK_M"]))

    args = (x2, qweight, scales, zeros, gidx, bias_arg, out, parts, M, N, K, per_split, m_bucket)
    _run("splitk", grid_splitk, args, {**common, "PARTIAL": split > 1}, interpret)
    if split > 1:
        total = parts.sum(dim=0)
        if bias is not None:
            total += bias.float()
        out.copy_(total)
    return out.reshape(*x.shape[:-1], N)


def _run(variant: Literal["gemm", "splitk"], grid, args: tuple, flags: dict, interpret: bool) -> None:
    """Launch the autotuned kernel, or under the interpreter the plain kernel with its one config."""
    if interpret:
        config = kernel_configs(variant, interpret=True)[0]
        kernel = _w4a16_gemm_kernel if variant == "gemm" else _w4a16_splitk_kernel
        kernel[grid(config)](*args, **flags, **config)
    else:
        kernel = _gemm_tuned if variant == "gemm" else _splitk_tuned
        kernel[grid](*args, **flags)


def w4a16_linear_torch(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor,
                       g_idx: torch.Tensor | None, bias: torch.Tensor | None, group_size: int) -> torch.Tensor:
    """The reference: ``y = x @ W.T + b`` in fp32 from the exactly dequantized ``W``, rounded once to
    ``x.dtype``. For float32 ``x`` it is ``infopt::int4_linear`` exactly."""
    return int4_linear_torch(x.float(), qweight, scales, zeros, g_idx, bias, group_size).to(x.dtype)


def triton_unusable(x: torch.Tensor) -> str | None:
    """Why the CUDA op falls back to the reference for ``x``, or None when the kernel runs."""
    if triton is None:
        return "triton is not installed"
    if x.dtype not in ACTIVATION_DTYPES:
        return f"activations are {x.dtype}; the kernel takes float16 or bfloat16"
    return None


@torch.library.custom_op("infopt::w4a16_linear", mutates_args=())
def _w4a16_linear_op(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor,
                     g_idx: torch.Tensor | None, bias: torch.Tensor | None, group_size: int) -> torch.Tensor:
    """``infopt::int4_linear``'s arguments and result; the Triton kernel on CUDA, the reference elsewhere."""
    return w4a16_linear_torch(x, qweight, scales, zeros, g_idx, bias, group_size)


@_w4a16_linear_op.register_kernel("cuda")
def _(x, qweight, scales, zeros, g_idx, bias, group_size):
    reason = triton_unusable(x)
    if reason is None:
        return w4a16_linear_triton(x, qweight, scales, zeros, g_idx, bias, group_size)
    log.debug("w4a16_linear runs the torch reference: %s", reason)
    return w4a16_linear_torch(x, qweight, scales, zeros, g_idx, bias, group_size)


@_w4a16_linear_op.register_fake
def _(x, qweight, scales, zeros, g_idx, bias, group_size):
    return x.new_empty((*x.shape[:-1], qweight.shape[0]))


def w4a16_linear(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor,
                 g_idx: torch.Tensor | None = None, bias: torch.Tensor | None = None,
                 group_size: int = 128) -> torch.Tensor:
    """``x @ W.T + bias`` for a packed INT4 weight through ``torch.ops.infopt.w4a16_linear``."""
    return torch.ops.infopt.w4a16_linear(x, qweight, scales, zeros, g_idx, bias, group_size)
