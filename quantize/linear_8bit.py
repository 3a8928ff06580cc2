"""FP8 and INT8 Linear layers that run on stock PyTorch (no TensorRT): ``torch._scaled_mm`` and ``torch._int_mm``.

- :class:`Fp8Linear`: the weight stored in float8e4m3fn with one scale per output channel; the activation
  quantized per call with one scale per tensor (its absolute maximum over 448); the product through
  ``torch._scaled_mm`` (per-tensor scales, which every device that has it takes), then each output channel
  multiplied by its weight scale (Inductor fuses that into the epilogue).
- :class:`Int8Linear`: W8A8 with dynamic activations: the weight in int8 per output channel, the activation
  quantized per call per row (a token, a sample), the product in int32 through ``torch._int_mm``, then both
  scales. On CUDA ``_int_mm`` wants more than 16 rows: 17 rows of zeros are added and cut off again.

A layer whose shape the device's kernel cannot take (CUDA: FP8 needs both dims of the weight divisible by 16,
INT8 by 8) stays in float, and :func:`swap` says which. On the CPU both ops run too (torch 2.13), so a CPU
machine checks the drift of the same program a GPU runs.
"""

from __future__ import annotations

import torch
from torch import nn

E4M3_MAX = 448.0
ALIGN = {("fp8", "cuda"): 16, ("int8", "cuda"): 8}
"""the multiple both dims of a weight must be for the device's kernel"""


class Fp8Linear(nn.Module):
    def __init__(self, linear: nn.Linear):
        super().__init__()
        weight = linear.weight.detach().float()
        scale = weight.abs().amax(dim=1, keepdim=True).clamp(min=1e-12) / E4M3_MAX
        self.register_buffer("weight_fp8", (weight / scale).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn))
        self.register_buffer("weight_scale", scale.reshape(1, -1).contiguous())
        self.register_buffer("bias", None if linear.bias is None else linear.bias.detach().float().clone())
        self.in_features, self.out_features = linear.in_features, linear.out_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, x.shape[-1]).float()
        scale = rows.abs().amax().clamp(min=1e-12) / E4M3_MAX
        quantized = (rows / scale).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
        one = torch.ones((), dtype=torch.float32, device=x.device)
        out = torch._scaled_mm(quantized, self.weight_fp8.t(), scale_a=scale.reshape(()), scale_b=one,
                               out_dtype=torch.float32) * self.weight_scale
        if self.bias is not None:
            out = out + self.bias
        return out.to(x.dtype).reshape(*x.shape[:-1], self.out_features)


class Int8Linear(nn.Module):
    def __init__(self, linear: nn.Linear, pad_rows: int = 0):
        super().__init__()
        weight = linear.weight.detach().float()
        scale = weight.abs().amax(dim=1, keepdim=True).clamp(min=1e-12) / 127.0
        self.register_buffer("weight_int8", (weight / scale).round().clamp(-127, 127).to(torch.int8).t().contiguous())
        self.register_buffer("weight_scale", scale.reshape(1, -1).contiguous())
        self.register_buffer("bias", None if linear.bias is None else linear.bias.detach().float().clone())
        self.in_features, self.out_features, self.pad_rows = linear.in_features, linear.out_features, pad_rows

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, x.shape[-1]).float()
        scale = rows.abs().amax(dim=1, keepdim=True).clamp(min=1e-12) / 127.0
        quantized = (rows / scale).round().clamp(-127, 127).to(torch.int8)
        if self.pad_rows:
            quantized = nn.functional.pad(quantized, (0, 0, 0, self.pad_rows))
        product = torch._int_mm(quantized, self.weight_int8)
        if self.pad_rows:
            product = product[:rows.shape[0]]
        out = product.float() * scale * self.weight_scale
        if self.bias is not None:
            out = out + self.bias
        return out.to(x.dtype).reshape(*x.shape[:-1], self.out_features)


def swap(module: nn.Module, precision: str, device: str, keep_float: tuple[str, ...] = ()) -> tuple[list[str], list[str]]:
    """Replace ``module``'s ``nn.Linear`` layers in place with :class:`Fp8Linear` (``fp8``) or :class:`Int8Linear`
    (``int8``) for ``device``: (the names swapped, the names kept in float with why)."""
    align = ALIGN.get((precision, device), 1)
    swapped, kept = [], []
    for name, child in list(module.named_modules()):
        for attr, layer in list(child.named_children()):
            if not isinstance(layer, nn.Linear):
                continue
            full = f"{name}.{attr}" if name else attr
            if attr in keep_float:
                kept.append(f"{full} (kept in float, as the recipe asks)")
                continue
            if layer.in_features % align or layer.out_features % align:
                kept.append(f"{full} ({layer.in_features}x{layer.out_features}: {device}'s {precision} kernel needs "
                            f"multiples of {align})")
                continue
            replacement = (Fp8Linear(layer) if precision == "fp8"
                           else Int8Linear(layer, pad_rows=17 if device == "cuda" else 0))
            setattr(child, attr, replacement.to(layer.weight.device))
            swapped.append(full)
    return swapped, kept
