"""AWQ then GPTQ: AWQ's per-input-feature scales, then GPTQ's error-compensating rounding of the scaled weight.

AWQ (``awq.py``) scales the weight's columns by ``s`` and divides the layer's input by it, so that the features
with loud activations get finer steps; it then rounds to nearest. GPTQ (``gptq.py``) rounds column by column and
spreads each rounding error over the columns not yet rounded. Here the two run in that order on one layer: the
scale search on AWQ's sample of the activations, then GPTQ on ``W diag(s)`` under the Hessian of the scaled input
``x / s``, ``diag(1/s) H diag(1/s)``, both from the same calibration rows. The scale stays the layer's
``input_scale``, as AWQ's does. GPTQ picks each group's grid from the columns it has updated, so AWQ's clip search
is not run. The output error GPTQ reports under the scaled Hessian is the error in the layer's own output:
``(x / s) (W s - Q)^T = x (W - Q / s)^T``. A layer that no scale helps keeps a scale of ones, so that every layer
has one.
"""

from __future__ import annotations

import dataclasses

import torch

from infopt.quantize import gptq
from infopt.quantize.awq import ActivationSample, search_scale
from infopt.quantize.int4_config import AWQGPTQConfig
from infopt.quantize.int4_methods import Int4Method, Quantized, register, relative_error


class SampleAndHessian:
    """AWQ's activation sample and GPTQ's Hessian of one layer's input, folded from the same rows."""

    def __init__(self, in_features: int, max_rows: int):
        self.sample = ActivationSample(in_features, max_rows=max_rows)
        self.hessian = gptq.Hessian(in_features)

    @property
    def rows(self) -> int:
        return self.hessian.rows

    def add(self, inputs: torch.Tensor) -> None:
        self.sample.add(inputs)
        self.hessian.add(inputs)


def _quantize(weight: torch.Tensor, statistic: SampleAndHessian, config: AWQGPTQConfig) -> Quantized:
    weight = weight.detach().float()
    scale, alpha = search_scale(weight, statistic.sample, config.group_size, config.symmetric, config.awq_grid)
    hessian = statistic.hessian.matrix
    scaled, scaled_hessian = weight, hessian
    if scale is not None:
        scale = scale.to(hessian.device)
        scaled = weight * scale.to(weight.device)[None, :]
        scaled_hessian = hessian / scale[:, None] / scale[None, :]
    packed, absolute = gptq.gptq_with_error(scaled, scaled_hessian, config.group_size, config.symmetric,
                                            config.damp, config.act_order, config.block_size)
    # a layer no scale helped keeps a scale of ones: every layer then has one, so the decoder's layers stay alike
    # and one is captured for all (a single unscaled layer made the real SmolLM2's export 8x longer)
    ones = torch.ones(weight.shape[1])
    packed = dataclasses.replace(packed, input_scale=ones if scale is None else scale.float().cpu().contiguous())
    return Quantized(packed, relative_error(absolute, weight.cpu(), hessian.cpu()), alpha, output_error=absolute)


HANDLER = register(Int4Method(AWQGPTQConfig, _quantize,
                              lambda config, in_features: SampleAndHessian(in_features, config.awq_rows)))
