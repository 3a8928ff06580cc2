"""Fused row-wise RMSNorm and LayerNorm over the last dimension (forward only).

- RMSNorm (Zhang & Sennrich, 2019): ``y = x / sqrt(mean(x^2) + eps) * weight``
- LayerNorm (Ba et al., 2016): ``y = (x - mean(x)) / sqrt(var(x) + eps) * weight + bias``, with the
  biased variance ``mean((x - mean(x))^2)``, as ``torch.nn.functional.layer_norm``.

``x`` is float16, bfloat16 or float32 of any hidden size ``H``; statistics and the affine step are
computed in fp32 and ``y`` is rounded once to ``x.dtype`` (weight and bias may be of any float dtype).
One program normalizes one row. A row of up to 8192 elements stays in registers (one read of ``x``);
a longer one is read in 4096-element chunks, twice for RMSNorm and three times for LayerNorm (sum,
centered sum of squares, normalize), the later reads mostly from L2. The layout follows
Liger-Kernel's ``ops/rms_norm.py``. Under ``TRITON_INTERPRET=1`` the launchers also take CPU tensors,
with 64-element rows and chunks so both paths run on small shapes.
"""

from __future__ import annotations

import functools

import torch
from torch import nn

from infopt.kernels.launcher import Relauncher, specialization

try:
    import triton
    import triton.language as tl
except ImportError:
    triton = tl = None

NORM_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def _jit(fn):
    return fn if triton is None else triton.jit(fn)


@_jit
def _rms_norm_kernel(x_ptr, w_ptr, y_ptr, H, stride_x, stride_y, eps, HAS_WEIGHT: tl.constexpr,
                     BLOCK: tl.constexpr, ONE_BLOCK: tl.constexpr):
    """Row ``program_id``: ``y = x * rsqrt(mean(x^2) + eps) * w``, the row in registers with
    ``ONE_BLOCK``, else a sum-of-squares pass and a normalize pass over ``BLOCK`` chunks."""
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * stride_x
    y_row = y_ptr + row * stride_y
    if ONE_BLOCK:
        cols = tl.arange(0, BLOCK)
        mask = cols < H
        x = tl.load(x_row + cols, mask=mask, other=0.0).to(tl.float32)
        rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / H + eps)
        y = x * rstd
        if HAS_WEIGHT:
            y = y * tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        tl.store(y_row + cols, y.to(y_ptr.dtype.element_ty), mask=mask)
    else:
        squares = tl.zeros((BLOCK,), dtype=tl.float32)
        for start in range(0, H, BLOCK):
            cols = start + tl.arange(0, BLOCK)
            x = tl.load(x_row + cols, mask=cols < H, other=0.0).to(tl.float32)
            squares += x * x
        rstd = 1.0 / tl.sqrt(tl.sum(squares, axis=0) / H + eps)
        for start in range(0, H, BLOCK):
            cols = start + tl.arange(0, BLOCK)
            mask = cols < H
            y = tl.load(x_row + cols, mask=mask, other=0.0).to(tl.float32) * rstd
            if HAS_WEIGHT:
                y = y * tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
            tl.store(y_row + cols, y.to(y_ptr.dtype.element_ty), mask=mask)


@_jit
def _layer_norm_kernel(x_ptr, w_ptr, b_ptr, y_ptr, H, stride_x, stride_y, eps, HAS_WEIGHT: tl.constexpr,
                       HAS_BIAS: tl.constexpr, BLOCK: tl.constexpr, ONE_BLOCK: tl.constexpr):
    """Row ``program_id``: ``y = (x - mean) * rsqrt(mean((x - mean)^2) + eps) * w + b``, the row in
    registers with ``ONE_BLOCK``, else mean, centered-variance and normalize passes over chunks."""
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * stride_x
    y_row = y_ptr + row * stride_y
    if ONE_BLOCK:
        cols = tl.arange(0, BLOCK)
        mask = cols < H
        x = tl.load(x_row + cols, mask=mask, other=0.0).to(tl.float32)
        mean = tl.sum(x, axis=0) / H
        centered = tl.where(mask, x - mean, 0.0)
        rstd = 1.0 / tl.sqrt(tl.sum(centered * centered, axis=0) / H + eps)
        y = centered * rstd
        if HAS_WEIGHT:
            y = y * tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        if HAS_BIAS:
            y = y + tl.load(b_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        tl.store(y_row + cols, y.to(y_ptr.dtype.element_ty), mask=mask)
    else:
        total = tl.zeros((BLOCK,), dtype=tl.float32)
        for start in range(0, H, BLOCK):
            cols = start + tl.arange(0, BLOCK)
            total += tl.load(x_row + cols, mask=cols < H, other=0.0).to(tl.float32)
        mean = tl.sum(total, axis=0) / H
        squares = tl.zeros((BLOCK,), dtype=tl.float32)
        for start in range(0, H, BLOCK):
            cols = start + tl.arange(0, BLOCK)
            mask = cols < H
            centered = tl.where(mask, tl.load(x_row + cols, mask=mask, other=0.0).to(tl.float32) - mean, 0.0)
            squares += centered * centered
        rstd = 1.0 / tl.sqrt(tl.sum(squares, axis=0) / H + eps)
        for start in range(0, H, BLOCK):
            cols = start + tl.arange(0, BLOCK)
            mask = cols < H
            y = (tl.load(x_row + cols, mask=mask, other=0.0).to(tl.float32) - mean) * rstd
            if HAS_WEIGHT:
                y = y * tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
            if HAS_BIAS:
                y = y + tl.load(b_ptr + cols, mask=mask, other=0.0).to(tl.float32)
            tl.store(y_row + cols, y.to(y_ptr.dtype.element_ty), mask=mask)


def interpreting() -> bool:
    """True when the kernels were built for Triton's CPU interpreter (``TRITON_INTERPRET=1`` when
    triton was imported; setting it later changes nothing)."""
    if triton is None:
        return False
    from triton.runtime.interpreter import InterpretedFunction

    return isinstance(_rms_norm_kernel, InterpretedFunction)


_INTERPRETING = interpreting()


@functools.lru_cache(maxsize=None)
def norm_config(hidden: int, interpret: bool) -> dict:
    """``BLOCK``, ``ONE_BLOCK`` and ``num_warps`` for rows of ``hidden`` elements: the whole row in
    one power-of-two block up to 8192 elements (64 under the interpreter), else 4096-element chunks
    (64); one warp per 256 elements of the block, 1 to 16. Cached: a call looks it up."""
    largest, chunk = (64, 64) if interpret else (8192, 4096)
    whole = 1 << max(hidden - 1, 0).bit_length()
    block = whole if whole <= largest else chunk
    return dict(BLOCK=block, ONE_BLOCK=whole <= largest, num_warps=min(max(block // 256, 1), 16))


def _check(name: str, x: torch.Tensor, **params: torch.Tensor | None) -> None:
    """Raise ValueError naming the first argument the kernel cannot take."""
    if x.dtype not in NORM_DTYPES:
        raise ValueError(f"{name}: x must be float16, bfloat16 or float32, got {x.dtype}")
    if x.dim() < 1 or x.shape[-1] == 0:
        raise ValueError(f"{name}: x must have a non-empty last dimension, got shape {list(x.shape)}")
    hidden = x.shape[-1]
    for key, value in params.items():
        if value is not None and (not value.is_floating_point() or list(value.shape) != [hidden]):
            raise ValueError(f"{name}: {key} must be a float tensor [{hidden}] (x's last dimension), "
                             f"got {value.dtype} {list(value.shape)}")
        if value is not None and value.device != x.device:
            raise ValueError(f"{name}: {key} is on {value.device} but x is on {x.device}")
        if value is not None and not value.is_contiguous():
            raise ValueError(f"{name}: {key} must be contiguous")
    if x.device.type not in ("cuda", "meta") and not _INTERPRETING:
        raise ValueError(f"{name}: the Triton kernel needs CUDA tensors, got {x.device} "
                         "(or set TRITON_INTERPRET=1 before triton is imported to run it on CPU)")


def _direct(kernel):
    return kernel


_RELAUNCH = {} if triton is None or _INTERPRETING else {
    k.fn.__name__: Relauncher(k) for k in (_rms_norm_kernel, _layer_norm_kernel)}
"""Direct launches skip Triton's argument binding on repeat calls (:mod:`infopt.kernels.launcher`)."""


def _launch(kernel, x: torch.Tensor, params: list[torch.Tensor | None], flags: dict, eps: float,
            wrapper=_direct) -> torch.Tensor:
    """Allocate ``y`` and launch one program per row; nothing is checked here (see :func:`_check`)."""
    hidden = x.shape[-1]
    x2 = x.reshape(-1, hidden)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    y = torch.empty((x2.shape[0], hidden), dtype=x.dtype, device=x.device)
    config = norm_config(hidden, _INTERPRETING)
    args = [x2, *[x2 if p is None else p for p in params], y, hidden, x2.stride(0), y.stride(0), eps]
    rows = x2.shape[0]
    if wrapper is _direct and _RELAUNCH:
        key = (hidden, x.device.index, *flags.values(), specialization(args))
        _RELAUNCH[kernel.fn.__name__](key, lambda meta: (rows,), args, dict(flags, **config))
    else:
        wrapper(kernel)[(rows,)](*args, **flags, **config)
    return y.reshape(x.shape)


def rms_norm_triton(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
    """The RMSNorm launcher, with the arguments checked first."""
    if triton is None:
        raise RuntimeError("the Triton norm kernels need triton, which is not installed")
    _check("rms_norm", x, weight=weight)
    if x.numel() == 0:
        return torch.empty_like(x)
    return _launch(_rms_norm_kernel, x, [weight], dict(HAS_WEIGHT=weight is not None), float(eps))


def layer_norm_triton(x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None,
                      eps: float) -> torch.Tensor:
    """The LayerNorm launcher, with the arguments checked first."""
    if triton is None:
        raise RuntimeError("the Triton norm kernels need triton, which is not installed")
    _check("layer_norm", x, weight=weight, bias=bias)
    if x.numel() == 0:
        return torch.empty_like(x)
    flags = dict(HAS_WEIGHT=weight is not None, HAS_BIAS=bias is not None)
    return _launch(_layer_norm_kernel, x, [weight, bias], flags, float(eps))


def rms_norm_torch(x: torch.Tensor, weight: torch.Tensor | None = None, eps: float = 1e-6) -> torch.Tensor:
    """Reference: ``x * rsqrt(mean(x^2, -1) + eps) * weight`` in fp32, rounded to ``x.dtype``."""
    xf = x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + eps)
    if weight is not None:
        y = y * weight.float()
    return y.to(x.dtype)


def layer_norm_torch(x: torch.Tensor, weight: torch.Tensor | None = None, bias: torch.Tensor | None = None,
                     eps: float = 1e-5) -> torch.Tensor:
    """Reference: ``torch.nn.functional.layer_norm`` over the last dimension in fp32, rounded to ``x.dtype``."""
    y = nn.functional.layer_norm(x.float(), (x.shape[-1],), None if weight is None else weight.float(),
                                 None if bias is None else bias.float(), eps)
    return y.to(x.dtype)


def _launches_directly(x: torch.Tensor) -> bool:
    """An eager call on real CUDA tensors, outside any tracing, with no gradient to record."""
    return (x.is_cuda and type(x) is torch.Tensor and x.dtype in NORM_DTYPES and not x.requires_grad
            and triton is not None and not torch.compiler.is_compiling())


def _on_kernel(x: torch.Tensor) -> bool:
    """Whether the op's body (run eagerly, or traced with fake tensors by a compiler) uses the kernel."""
    return triton is not None and x.device.type == "cuda" and x.dtype in NORM_DTYPES and x.numel() > 0


def _rms_norm_body(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
    """RMSNorm over the last dimension: the Triton kernel on CUDA, the reference elsewhere."""
    if not _on_kernel(x):
        return rms_norm_torch(x.contiguous(), weight, eps)
    return _launch(_rms_norm_kernel, x, [weight], dict(HAS_WEIGHT=weight is not None), eps,
                   torch.library.wrap_triton)


def _layer_norm_body(x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None,
                     eps: float) -> torch.Tensor:
    """LayerNorm over the last dimension: the Triton kernel on CUDA, the reference elsewhere."""
    if not _on_kernel(x):
        return layer_norm_torch(x.contiguous(), weight, bias, eps)
    flags = dict(HAS_WEIGHT=weight is not None, HAS_BIAS=bias is not None)
    return _launch(_layer_norm_kernel, x, [weight, bias], flags, eps, torch.library.wrap_triton)


# triton_op: torch.compile and AOTInductor see the Triton kernel itself and compile it in.
_define = torch.library.triton_op if triton is not None else torch.library.custom_op
_rms_norm_op = _define("infopt::rms_norm", _rms_norm_body, mutates_args=())
_layer_norm_op = _define("infopt::layer_norm", _layer_norm_body, mutates_args=())
_rms_norm_op.register_kernel("cpu")(lambda x, weight, eps: rms_norm_torch(x.contiguous(), weight, eps))
_layer_norm_op.register_kernel("cpu")(lambda x, weight, bias, eps: layer_norm_torch(x.contiguous(), weight, bias, eps))


@_rms_norm_op.register_fake
def _(x, weight, eps):
    _check("rms_norm", x, weight=weight)
    return x.new_empty(x.shape)


@_layer_norm_op.register_fake
def _(x, weight, bias, eps):
    _check("layer_norm", x, weight=weight, bias=bias)
    return x.new_empty(x.shape)


def rms_norm(x: torch.Tensor, weight: torch.Tensor | None = None, eps: float = 1e-6) -> torch.Tensor:
    """RMSNorm of ``x`` over its last dimension: launched directly on eager CUDA tensors, else
    through ``torch.ops.infopt.rms_norm`` (traced, compiled, or the reference off CUDA)."""
    if _launches_directly(x) and x.numel():
        return _launch(_rms_norm_kernel, x, [weight], dict(HAS_WEIGHT=weight is not None), eps)
    return torch.ops.infopt.rms_norm(x, weight, eps)


def layer_norm(x: torch.Tensor, weight: torch.Tensor | None = None, bias: torch.Tensor | None = None,
               eps: float = 1e-5) -> torch.Tensor:
    """LayerNorm of ``x`` over its last dimension: launched directly on eager CUDA tensors, else
    through ``torch.ops.infopt.layer_norm``."""
    if _launches_directly(x) and x.numel():
        return _launch(_layer_norm_kernel, x, [weight, bias],
                       dict(HAS_WEIGHT=weight is not None, HAS_BIAS=bias is not None), eps)
    return torch.ops.infopt.layer_norm(x, weight, bias, eps)
