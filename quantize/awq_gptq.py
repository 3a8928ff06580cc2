"""AWQ then GPTQ: AWQ's per-input-feature scales, then GPTQ's error-compensating rounding of the scaled weight.

AWQ (``awq.py``) scales the weight's columns by ``s`` and divides the layer's input by it, so that the features
with loud activations get finer steps; it then rounds to nearest. GPTQ (``gptq.py``) rounds column by column and
spreads each rounding error over the columns not yet rounded. Here the two run in that order on one layer: the
scale search under the layer's Hessian, then GPTQ on ``W diag(s)`` under the Hessian of the scaled input
``x / s``, ``diag(1/s) H diag(1/s)``, both from the same calibration rows. The scale stays the layer's
``input_scale``, as AWQ's does, but the layers reading one input (a block's query, key and value) share one scale,
searched on their rows stacked, as the AWQ paper's code does: it then folds into the norm before them
(``scale_folding.py``). GPTQ picks each group's grid from the columns it has updated, so AWQ's clip search
is not run. The output error GPTQ reports under the scaled Hessian is the error in the layer's own output:
``(x / s) (W s - Q)^T = x (W - Q / s)^T``. A layer that no scale helps keeps a scale of ones, so that every layer
has one.
"""

from __future__ import annotations

import dataclasses

import torch

from infopt.quantize import gptq
from infopt.quantize.awq import ActivationStatistics, ones_if_none, scaled_hessian, search_scale
from infopt.quantize.int4_config import AWQGPTQConfig
from infopt.quantize.int4_methods import Int4Method, Quantized, register, relative_error


def _quantize(weight: torch.Tensor, statistic: ActivationStatistics, config: AWQGPTQConfig) -> Quantized:
    weight = weight.detach().float()
    hessian = statistic.hessian.matrix
    scale, alpha = search_scale(weight, statistic.mean_abs, hessian, config.group_size, config.symmetric,
                                config.awq_grid)
    scaled = weight if scale is None else weight * scale[None, :]
    packed, absolute = gptq.gptq_with_error(scaled, scaled_hessian(hessian, scale), config.group_size, config.symmetric,
                                            config.damp, config.act_order, config.block_size, config.group_order,
                                            config.grid)
    packed = dataclasses.replace(packed, input_scale=ones_if_none(scale, weight.shape[1]))
    return Quantized(packed, relative_error(absolute, weight.cpu(), hessian.cpu()), alpha, output_error=absolute)


HANDLER = register(Int4Method(AWQGPTQConfig, _quantize, lambda config, in_features: ActivationStatistics(in_features),
                              stacks=True))
