"""infopt's packed INT4 format, the module that holds it, and the op that computes with it.

**The format** (:class:`Int4Weight`), for a Linear with ``N`` output and ``K`` input features and
group size ``g`` (``K % g == 0``, ``g`` even):

============  ==========================  ==================================================
tensor        dtype, shape                meaning
============  ==========================  ==================================================
``qweight``   uint8 ``[N, K // 2]``       two 4-bit codes per byte along ``K``: code ``(n, k)``
                                          is the low nibble of byte ``(n, k // 2)`` when ``k``
                                          is even, the high nibble when it is odd; codes 0..15
``scales``    float32 ``[N, K // g]``     one scale per output row and group
``zeros``     uint8 ``[N, K // g]``       one integer zero point (0..15) per row and group;
                                          symmetric quantization stores 8
``g_idx``     int32 ``[K]`` or absent     the group of input feature ``k`` (GPTQ act-order);
                                          absent means ``k // g``
``input_scale`` float32 ``[K]`` or absent AWQ's per-input-feature scale ``s`` that could not
                                          be folded into the layer before: the layer computes
                                          ``(x / s) @ W'.T`` with ``W' = W * s`` quantized
============  ==========================  ==================================================

and the weight it stands for is ``W[n, k] = (code(n, k) - zeros[n, G(k)]) * scales[n, G(k)]``.
Rows of ``qweight`` reshaped to ``[N, K // g, g // 2]`` are exactly ONNX Runtime's
``MatMulNBits`` blocks; the GPTQ and AWQ checkpoint emitters repack from this one layout.

The quantization grid follows GPTQ's ``Quantizer`` (Frantar et al., 2022, reference code
``quant.py``): asymmetric ``scale = (max - min) / 15``, ``zero = round(-min / scale)``; symmetric
``scale = 2 * max(|min|, |max|) / 15``, ``zero = 8``; ``code = clamp(round(w / scale) + zero, 0, 15)``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterator

import torch
from torch import nn

MAXQ = 15
SYMMETRIC_ZERO = 8


def pack_int4(codes: torch.Tensor) -> torch.Tensor:
    """``[N, K]`` codes 0..15 -> uint8 ``[N, K // 2]``, low nibble first."""
    codes = codes.to(torch.uint8)
    return codes[:, 0::2] | (codes[:, 1::2] << 4)


def unpack_int4(packed: torch.Tensor) -> torch.Tensor:
    """uint8 ``[N, K // 2]`` -> uint8 ``[N, K]`` codes, the inverse of :func:`pack_int4`."""
    low = packed & 0x0F
    high = packed >> 4
    return torch.stack([low, high], dim=-1).reshape(packed.shape[0], packed.shape[1] * 2)


def dequantize_int4(qweight: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor,
                    g_idx: torch.Tensor | None, group_size: int) -> torch.Tensor:
    """The float weight ``[N, K]`` the packed tensors stand for, in ``scales.dtype``."""
    codes = unpack_int4(qweight).to(scales.dtype)
    if g_idx is None:
        s = scales.repeat_interleave(group_size, dim=1)
        z = zeros.to(scales.dtype).repeat_interleave(group_size, dim=1)
    else:
        s = scales[:, g_idx.long()]
        z = zeros.to(scales.dtype)[:, g_idx.long()]
    return (codes - z) * s


def grid(weight: torch.Tensor, symmetric: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Scale and zero point per row of ``weight`` (``[rows, group]`` -> ``[rows]``, ``[rows]``)."""
    return range_grid(weight.amin(dim=1), weight.amax(dim=1), symmetric)


def range_grid(wmin: torch.Tensor, wmax: torch.Tensor, symmetric: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`grid` from each row's least and greatest value."""
    wmin, wmax = wmin.clamp(max=0), wmax.clamp(min=0)
    if symmetric:
        wmax = torch.maximum(wmin.abs(), wmax)
        scale = 2 * wmax / MAXQ
        zero = torch.full_like(scale, SYMMETRIC_ZERO)
    else:
        scale = (wmax - wmin) / MAXQ
        zero = None
    scale = torch.where(scale == 0, torch.ones_like(scale), scale)
    if zero is None:
        zero = torch.round(-wmin / scale).clamp(0, MAXQ)
    return scale, zero


def quantize_codes(weight: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor) -> torch.Tensor:
    """Codes 0..15 for ``weight`` ``[rows, cols]`` with per-row (or broadcastable) scale and zero."""
    if scale.dim() == 1:
        scale, zero = scale[:, None], zero[:, None]
    return torch.clamp(torch.round(weight / scale) + zero, 0, MAXQ)


def fake_quantize(weight: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor) -> torch.Tensor:
    """``weight`` rounded to the grid and back: what the quantized layer will compute with."""
    if scale.dim() == 1:
        scale, zero = scale[:, None], zero[:, None]
    return (quantize_codes(weight, scale, zero) - zero) * scale


@dataclass
class Int4Weight:
    """One Linear's weight in the packed format above (CPU tensors)."""

    qweight: torch.Tensor
    scales: torch.Tensor
    zeros: torch.Tensor
    group_size: int
    symmetric: bool
    g_idx: torch.Tensor | None = None
    input_scale: torch.Tensor | None = None

    @property
    def out_features(self) -> int:
        return int(self.qweight.shape[0])

    @property
    def in_features(self) -> int:
        return int(self.qweight.shape[1] * 2)

    def dequantize(self) -> torch.Tensor:
        """The float32 weight the layer computes with, as applied to ``x / input_scale``."""
        return dequantize_int4(self.qweight, self.scales, self.zeros, self.g_idx, self.group_size)

    def effective_weight(self) -> torch.Tensor:
        """The float32 weight applied to ``x`` itself (``input_scale`` divided back out)."""
        weight = self.dequantize()
        return weight / self.input_scale[None, :] if self.input_scale is not None else weight

    def split_rows(self, sizes: list[int]) -> list["Int4Weight"]:
        """The weights of layers whose rows were stacked into this one, ``sizes`` output rows each (in order)."""
        if len(sizes) == 1:
            return [self]
        parts = zip(self.qweight.split(sizes), self.scales.split(sizes), self.zeros.split(sizes))
        return [Int4Weight(q.contiguous(), s.contiguous(), z.contiguous(), self.group_size, self.symmetric,
                           self.g_idx, self.input_scale) for q, s, z in parts]

    def sorted_groups(self) -> bool:
        """True when input features are in group order, so a layout without ``g_idx`` can hold it."""
        if self.g_idx is None:
            return True
        return bool(torch.equal(self.g_idx.long(), torch.arange(self.in_features) // self.group_size))

    @classmethod
    def from_codes(cls, codes: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor, group_size: int,
                   symmetric: bool, g_idx: torch.Tensor | None = None,
                   input_scale: torch.Tensor | None = None) -> "Int4Weight":
        """Pack ``[N, K]`` codes with ``[N, K // g]`` scales and zeros; a trivial ``g_idx`` is dropped."""
        weight = cls(pack_int4(codes), scales.float().contiguous(), zeros.to(torch.uint8).contiguous(),
                     group_size, symmetric, None if g_idx is None else g_idx.to(torch.int32).contiguous(),
                     None if input_scale is None else input_scale.float().contiguous())
        if weight.sorted_groups():
            weight.g_idx = None
        return weight


def check_group_size(name: str, in_features: int, group_size: int) -> str | None:
    """Why ``group_size`` (even, checked by :class:`Int4Config`) cannot quantize a layer with
    ``in_features`` inputs, or None if it can."""
    if in_features % group_size:
        return (f"group size {group_size} does not divide {name}'s {in_features} input features "
                f"({in_features} / {group_size} = {in_features / group_size:.2f})")
    return None


@torch.library.custom_op("infopt::int4_linear", mutates_args=())
def int4_linear(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor,
                g_idx: torch.Tensor | None, bias: torch.Tensor | None, group_size: int) -> torch.Tensor:
    """``x @ W.T + bias`` with ``W`` the packed 4-bit weight; the portable (pure torch) form.

    One node in an exported graph: the ONNX exporter lowers it to ``MatMulNBits`` and the CUDA
    kernel pass swaps it for the Triton W4A16 kernel op.
    """
    return int4_linear_torch(x, qweight, scales, zeros, g_idx, bias, group_size)


def int4_linear_torch(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor,
                      g_idx: torch.Tensor | None, bias: torch.Tensor | None, group_size: int) -> torch.Tensor:
    """The pure-torch body of ``infopt::int4_linear``: dequantize, then ``linear``."""
    weight = dequantize_int4(qweight, scales.to(x.dtype), zeros, g_idx, group_size)
    return nn.functional.linear(x, weight, None if bias is None else bias.to(x.dtype))


def decompose_int4(program):
    """``program`` with each ``infopt.int4_linear`` node replaced by its aten ops (unpack,
    dequantize, linear), and how many there were: a compiled package then has no call back into
    infopt, and Inductor fuses the dequantization into generated code."""
    op = torch.ops.infopt.int4_linear.default
    count = sum(1 for n in program.graph.nodes if n.op == "call_function" and n.target is op)
    if count == 0:
        return program, 0
    return program.run_decompositions({op: int4_linear_torch}), count


@int4_linear.register_fake
def _(x, qweight, scales, zeros, g_idx, bias, group_size):
    return x.new_empty((*x.shape[:-1], qweight.shape[0]))


class Int4Linear(nn.Module):
    """A Linear whose weight is held in the packed INT4 format; computes in the input's dtype."""

    def __init__(self, weight: Int4Weight, bias: torch.Tensor | None):
        super().__init__()
        self.in_features = weight.in_features
        self.out_features = weight.out_features
        self.group_size = weight.group_size
        self.symmetric = weight.symmetric
        self.register_buffer("qweight", weight.qweight)
        self.register_buffer("scales", weight.scales)
        self.register_buffer("zeros", weight.zeros)
        self.register_buffer("g_idx", weight.g_idx)
        self.register_buffer("input_scale", weight.input_scale)
        self.register_buffer("bias", None if bias is None else bias.detach().float().clone())

    @property
    def weight(self) -> torch.Tensor:
        """A data-less ``meta`` tensor of the logical ``[out, in]`` shape and dtype. Code that reads a
        Linear's weight shape keeps working, and PyTorch's fused transformer fast path (which
        ``nn.TransformerEncoderLayer`` takes in inference and which needs the float weight) sees a
        device it does not support and keeps to the ordinary path, whose Linears this replaces."""
        return torch.empty((self.out_features, self.in_features), dtype=self.scales.dtype, device="meta")

    def int4_weight(self) -> Int4Weight:
        return Int4Weight(self.qweight, self.scales, self.zeros, self.group_size, self.symmetric,
                          self.g_idx, self.input_scale)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.input_scale is not None:
            x = x / self.input_scale.to(x.dtype)
        return torch.ops.infopt.int4_linear(x, self.qweight, self.scales, self.zeros, self.g_idx, self.bias,
                                            self.group_size)

    def extra_repr(self) -> str:
        order = ", act-order" if self.g_idx is not None else ""
        awq = ", input scales" if self.input_scale is not None else ""
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"group_size={self.group_size}, {'sym' if self.symmetric else 'asym'}{order}{awq}")


LinearFilter = Callable[[str, nn.Linear], bool]


HEAD_NAMES = frozenset({"lm_head", "embed_out"})
"""an LLM's output head, by the last part of its module path (transformers' names: most families, GPT-NeoX)"""


def default_filter(name: str, module: nn.Linear) -> bool:
    """Every Linear except an LLM's output head (servers keep ``lm_head`` in 16 bits)."""
    return name.split(".")[-1] not in HEAD_NAMES


def quantizable_linears(model: nn.Module, keep: LinearFilter = default_filter) -> Iterator[tuple[str, nn.Linear]]:
    """The ``nn.Linear`` modules to quantize, found by module type and ``keep``, in definition order."""
    for name, module in model.named_modules():
        if type(module) is nn.Linear and keep(name, module):
            yield name, module


def conv1d_as_linear(model: nn.Module) -> list[str]:
    """Replace, in place, each of transformers' ``Conv1D`` layers (GPT-2's projections: a Linear whose
    weight is stored ``[in, out]``) with the ``nn.Linear`` that computes the same; returns their paths."""
    found = [(name, m) for name, m in model.named_modules()
             if type(m).__name__ == "Conv1D" and getattr(m, "weight", None) is not None and m.weight.dim() == 2
             and getattr(m, "nf", None) == m.weight.shape[1]]
    for name, conv in found:
        linear = nn.Linear(conv.weight.shape[0], conv.weight.shape[1], bias=conv.bias is not None,
                           device=conv.weight.device, dtype=conv.weight.dtype)
        with torch.no_grad():
            linear.weight.copy_(conv.weight.T)
            if conv.bias is not None:
                linear.bias.copy_(conv.bias)
        replace_module(model, name, linear)
    return [name for name, _ in found]


def replace_module(model: nn.Module, name: str, new: nn.Module) -> None:
    parent_name, _, child = name.rpartition(".")
    parent = model.get_submodule(parent_name) if parent_name else model
    setattr(parent, child, new)


def int4_layers(model: nn.Module) -> dict[str, Int4Weight]:
    """Every :class:`Int4Linear` in ``model`` by module path, as :class:`Int4Weight`."""
    return {name: m.int4_weight() for name, m in model.named_modules() if isinstance(m, Int4Linear)}
