"""``infopt.compile``: a ``torch.compile``d module with a target recipe's Inductor options, in process.

For training repos and notebooks that want the speed without an output folder: the same Inductor
settings (freezing, max-autotune) and precision cast the ``inductor`` recipe for the target uses,
Inductor's cache in infopt's cache folder, and the module moved to the target's device.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from infopt.core.cache import cache_dir
from infopt.core.recipe import find_recipe, load_recipe
from infopt.core.target import get_target
from infopt.passes.fx.cast_precision import DTYPES, cast_module
from infopt.passes.lower.aoti_compile import in_process_settings, inductor_configs, resolve_device, user_cache_dir


def compile(module: Any, *, target: str = "cpu", precision: str = "fp32", recipe: str | Path | None = None,
            dynamic: bool | None = None):
    """``torch.compile(module)`` with the target recipe's Inductor options.

    ``precision`` fp16/bf16 computes in that dtype with the caller's input and output dtypes kept.
    Freezing applies under ``torch.no_grad()``/``torch.inference_mode()``, the way inference runs.
    Inductor's cache goes to ``$INFOPT_CACHE_DIR/inductor`` for the process unless
    ``TORCHINDUCTOR_CACHE_DIR`` is already set (compilation happens at the first call, so the
    setting has to outlive this function).
    """
    import torch

    target_obj = get_target(target)
    chosen = load_recipe(recipe) if recipe else find_recipe(target_obj, precision, "inductor")
    target_obj.require_precision(chosen.precision)
    options, cast = in_process_settings(chosen)
    device = resolve_device(options.device, target_obj.device)
    if cast is not None:
        module = cast_module(module, getattr(torch, DTYPES[cast]))
    if not user_cache_dir():
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(cache_dir("inductor"))
    return torch.compile(module.eval().to(device), backend="inductor", options=inductor_configs(options), dynamic=dynamic)
