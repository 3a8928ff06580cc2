"""INT4 method handlers, registered by config class as torchao registers its quantization handlers.

A handler says how its method quantizes one Linear: the statistic it collects from calibration
activations (none for a method without data) and the function that turns the layer's weight and
that statistic into packed INT4 under the method's config. ``quantize/weight_only.py`` streams
the calibration and calls the handler of the config it is given; it never names a method.

A new method: its config class in ``int4_config.py`` (registered in ``METHOD_CONFIGS``, named in
``Method``), and a module that registers its handler here, imported by ``weight_only.py``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, NamedTuple, Protocol

import torch

from infopt.core.cpu_features import bf16_products_fast
from infopt.core.registry import Registry
from infopt.quantize.int4_config import Int4MethodConfig
from infopt.quantize.int4_format import Int4Weight


class Statistic(Protocol):
    rows: int
    """calibration rows folded in so far"""

    def add(self, inputs: torch.Tensor) -> None: ...


class Quantized(NamedTuple):
    weight: Int4Weight
    error: float | None
    """the layer's relative output error on the calibration data (:func:`weighted_error`); None without data"""
    alpha: float | None = None
    """AWQ's scale exponent, for the report"""
    output_error: float | None = None
    """``tr(E H E^T)``, the error the layer adds to its output on the calibration data in the output's own units
    (:func:`output_errors`): how far it moves the residual stream, which ranks layers for 8 bits"""


@dataclass(frozen=True)
class Int4Method:
    config: type[Int4MethodConfig]
    quantize: Callable[[torch.Tensor, Any, Any], Quantized]
    """``(weight [N, K] float32, statistic or None, config) -> Quantized``"""
    statistic: Callable[[Any, int], Statistic] | None = None
    """``(config, in_features) -> Statistic`` the calibration activations are folded into; None: no data"""
    stacks: bool = False
    """each output row is rounded on its own given the statistic, so layers reading one input (a block's query,
    key and value) may be quantized as one weight, their rows stacked: the same codes, one pass over the columns"""

    @property
    def name(self) -> str:
        return self.config.name


HANDLERS: Registry[Int4Method] = Registry("INT4 method handler", lambda m: m.name)
register = HANDLERS.register


def handler_for(config: Int4MethodConfig) -> Int4Method:
    handler = HANDLERS.named(config.name)
    if not isinstance(config, handler.config):
        raise TypeError(f"the {config.name} handler takes {handler.config.__name__}, not {type(config).__name__}")
    return handler


def output_errors(weight: torch.Tensor, quantized: torch.Tensor, hessian: torch.Tensor) -> tuple[float, float]:
    """``tr(E H E^T)`` with ``E = W - Q`` (the output error on the calibration data), and that over ``tr(W H W^T)``
    (relative: 0 is exact)."""
    num = output_energy(weight - quantized, hessian)
    return num, relative_error(num, weight, hessian)


def output_energy(weight: torch.Tensor, hessian: torch.Tensor) -> float:
    """``tr(W H W^T)``: what the layer's output carries on the calibration data. A bf16 ``hessian`` takes the product
    through bf16 (each sum of products in fp32), several times faster on CPUs with bf16 units."""
    product = weight.to(hessian.dtype) @ hessian
    return float(torch.dot(product.float().view(-1), weight.float().reshape(-1)))


def product_dtype(device: torch.device) -> torch.dtype:
    """bf16 where its matrix products are fast on ``device`` (a GPU, a CPU with bf16 instructions), else float32:
    the dtype the searches and figures that only rank or scale take their products in."""
    return torch.bfloat16 if bf16_products_fast(device.type) else torch.float32


def relative_error(error: float, weight: torch.Tensor, hessian: torch.Tensor, whole: float | None = None) -> float:
    """``error`` (``tr(E H E^T)``) over ``tr(W H W^T)``; 0 for a layer whose output is nothing. The denominator is
    ``whole`` where the caller has it, else a product in :func:`product_dtype`: it only scales the figure, and a wide
    layer's product is then several times faster where bf16 is."""
    if whole is None:
        whole = output_energy(weight, hessian.to(product_dtype(hessian.device)))
    return error / whole if whole > 0 else 0.0


def weighted_error(weight: torch.Tensor, quantized: torch.Tensor, hessian: torch.Tensor) -> float:
    """``tr(E H E^T) / tr(W H W^T)``: the layer's relative output error on the calibration data (0 is exact)."""
    return output_errors(weight, quantized, hessian)[1]
