"""The W4A16 kernel's weight layout, made once from infopt's packed INT4 format and undone exactly.

infopt's format (:mod:`infopt.quantize.int4_format`) packs codes ``k`` and ``k + 1`` into one byte,
which suits ONNX ``MatMulNBits`` and the GPTQ/AWQ checkpoints but not a tensor-core kernel: splitting
each byte into two interleaved halves costs a shuffle per element. The kernel layout keeps the same
tensors, shapes and dtypes (``qweight`` uint8 ``[N, K // 2]``, ``scales``, ``zeros``, and an int32
``[K]`` where the format has ``g_idx``) and changes only the order of the codes:

- **split halves per group**: for group ``G`` (input features ``[G*g, (G+1)*g)``, ``h = g // 2``),
  byte ``G*h + j`` of a row holds code ``G*g + j`` in its low nibble and code ``G*g + h + j`` in its
  high one. ``byte & 0xF`` is then the group's first half and ``byte >> 4`` its second half, each a
  contiguous run of input features that the kernel multiplies as one tile, with no shuffle;
- **act-order as a permutation**: a GPTQ act-order weight (``g_idx``) is stored with its input
  features sorted by group (``perm = argsort(g_idx)``, stable), so that groups are contiguous again;
  the kernel reads ``x[:, perm]``, which is small, instead of gathering scales per element.

A row of one group is ``g / 2`` contiguous bytes (64 for the usual ``g = 128``), loaded 16 bytes per
thread. The kernel multiplies each half group as one tensor-core tile, so ``g / 2`` must be a power of
two of at least 16: ``g`` in 32, 64, 128, 256, ...; :func:`unsupported` says why a weight does not fit.
"""

from __future__ import annotations

import torch

from infopt.quantize.int4_format import pack_int4, unpack_int4

MIN_GROUP = 32
"""Half a group is one tile's depth, and a tensor-core tile is at least 16 deep."""


def unsupported(in_features: int, group_size: int, g_idx: torch.Tensor | None) -> str | None:
    """Why a weight cannot take the kernel layout, or None when it can."""
    if group_size < MIN_GROUP or group_size & (group_size - 1):
        return f"group size {group_size}: the W4A16 kernel takes a power of two of at least {MIN_GROUP}"
    if in_features % group_size:
        return f"group size {group_size} does not divide the {in_features} input features"
    if g_idx is not None:
        counts = torch.bincount(g_idx.long().cpu(), minlength=in_features // group_size)
        if counts.numel() != in_features // group_size or bool((counts != group_size).any()):
            return "its act-order groups are not all of the group size, so sorting them leaves no contiguous groups"
    return None


def act_order_permutation(g_idx: torch.Tensor | None) -> torch.Tensor | None:
    """Input features sorted by group (stable), int32; None without act-order."""
    if g_idx is None:
        return None
    return torch.argsort(g_idx.long().cpu(), stable=True).to(torch.int32)


def split_halves(codes: torch.Tensor, group_size: int) -> torch.Tensor:
    """``[N, K]`` codes -> uint8 ``[N, K // 2]`` in the split-halves order above."""
    n, k = codes.shape
    half = group_size // 2
    grouped = codes.to(torch.uint8).reshape(n, k // group_size, 2, half)
    return (grouped[:, :, 0] | (grouped[:, :, 1] << 4)).reshape(n, k // 2)


def join_halves(packed: torch.Tensor, group_size: int) -> torch.Tensor:
    """uint8 ``[N, K // 2]`` in the split-halves order -> ``[N, K]`` codes (uint8)."""
    n, k_half = packed.shape
    half = group_size // 2
    grouped = packed.reshape(n, k_half // half, 1, half)
    return torch.cat([grouped & 0x0F, grouped >> 4], dim=2).reshape(n, k_half * 2)


def to_kernel_layout(qweight: torch.Tensor, g_idx: torch.Tensor | None,
                     group_size: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``(qweight, perm)`` in the kernel layout from the packed format's ``qweight`` and ``g_idx``,
    on ``qweight``'s device. Check :func:`unsupported` first."""
    codes = unpack_int4(qweight)
    perm = act_order_permutation(g_idx)
    if perm is not None:
        codes = codes[:, perm.long().to(codes.device)]
    packed = split_halves(codes, group_size).contiguous()
    return packed, None if perm is None else perm.to(qweight.device)


def from_kernel_layout(qweight_k: torch.Tensor, perm: torch.Tensor | None,
                       group_size: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The packed format's ``(qweight, g_idx)`` from the kernel layout: the exact inverse."""
    codes = join_halves(qweight_k, group_size)
    g_idx = None
    if perm is not None:
        order = perm.long().to(codes.device)
        restored = torch.empty_like(codes)
        restored[:, order] = codes
        codes = restored
        g_idx = torch.empty(codes.shape[1], dtype=torch.int32, device=perm.device)
        g_idx[order.to(perm.device)] = (torch.arange(codes.shape[1], device=perm.device) // group_size).to(torch.int32)
    return pack_int4(codes), g_idx
