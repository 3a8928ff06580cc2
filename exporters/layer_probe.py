"""A decoder's first two layers standing in for all of them while it is captured and exported.

Capturing and translating a decoder costs time in proportion to its graph, and the graph of an LLM is one
layer's graph repeated: a 24-layer Qwen2.5-0.5B took 9 s to capture and 30 s to translate and optimize, where
its first two layers take 2 s and 5 s. So where every layer is built alike (:func:`plan`), the decoder is
captured with its first :data:`PROBE_LAYERS` layers (:func:`truncated`), and ``onnx_export`` stamps the
second layer's nodes once for every other layer with that layer's own weights
(``passes/lower/onnx_stamp.py``). The probe shares the model's tensors: nothing is copied.

"Alike" is checked, not assumed: the same class, the same tensors (names, shapes, dtypes), the same scalar
settings on every submodule (a sliding window, an attention type) but the layer's index, and one
``layer_types`` entry in the config. A model that differs anywhere is captured whole, and the note says why.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Callable, Iterator

PROBE_LAYERS = 2
"""the layers the probe keeps: the first, and a second whose nodes are stamped for the rest"""
INDEX_ATTRIBUTES = ("layer_idx", "layer_index", "layer_id", "layer_number", "idx")
"""a layer's attributes that hold its own index, which differ between alike layers"""


@dataclass
class LayerStamp:
    """What ``onnx_export`` needs to stamp a probe's layers (``Artifact.products``)."""

    lm: Any
    """the whole causal LM: the stamped layers' tensors are read from it"""
    path: str
    """the layers' ModuleList in the LM (``model.layers``)"""
    layers: int
    """how many layers the LM has"""
    input_names: list[str]
    """the probe's inputs, as the exporter names them (two layers' cache)"""
    output_names: list[str]
    recapture: Callable[[], Any]
    """the whole decoder captured, where the probe's exported layers turn out not to match"""

    def tensor(self, name: str):
        """The LM's parameter or buffer with the captured decoder's name (``lm.model.layers.5.mlp.up_proj.weight``)."""
        owner, _, attribute = name.removeprefix("lm.").rpartition(".")
        return getattr(self.lm.get_submodule(owner), attribute)


def layer_list(lm) -> tuple[str, Any] | None:
    """The path and the ModuleList of the LM's decoder layers: the longest list of modules of one class."""
    import torch

    found = [(name, module) for name, module in lm.named_modules()
             if isinstance(module, torch.nn.ModuleList) and len(module) > 1
             and len({type(m) for m in module}) == 1]
    return max(found, key=lambda item: len(item[1]), default=None)


def plan(lm, layers: int) -> tuple[str, Any] | str:
    """``(path, ModuleList)`` when the decoder's layers can be stamped from a probe, else why not (words)."""
    if layers <= PROBE_LAYERS:
        return f"{layers} layers: captured whole"
    found = layer_list(lm)
    if found is None or len(found[1]) != layers:
        return "its decoder layers were not found as one list of modules of one class"
    path, modules = found
    types = getattr(lm.config, "layer_types", None)
    if isinstance(types, (list, tuple)) and len(set(types)) > 1:
        return f"its layers are of {len(set(types))} types ({', '.join(sorted(set(map(str, types))))})"
    first = _shape(modules[0])
    for index, module in enumerate(modules):
        if _shape(module) != first:
            return f"layer {index} is built unlike layer 0"
    return path, modules


def _shape(layer) -> tuple:
    """What must be equal between two layers for one to stand for the other."""
    tensors = tuple((name, tuple(t.shape), t.dtype) for name, t in
                    [*layer.named_parameters(remove_duplicate=False), *layer.named_buffers(remove_duplicate=False)])
    settings = tuple((name, type(module).__name__, tuple(sorted(
        (key, value) for key, value in vars(module).items()
        if not key.startswith("_") and key not in INDEX_ATTRIBUTES
        and isinstance(value, (bool, int, float, str, type(None))))))
        for name, module in layer.named_modules())
    return tensors, settings


@contextlib.contextmanager
def truncated(lm, path: str, keep: int = PROBE_LAYERS) -> Iterator[None]:
    """The LM with only its first ``keep`` layers (and its config saying so) while the block runs."""
    import torch

    owner_name, _, attribute = path.rpartition(".")
    owner = lm.get_submodule(owner_name) if owner_name else lm
    modules = getattr(owner, attribute)
    config = lm.config
    saved = {key: getattr(config, key) for key in ("num_hidden_layers", "layer_types") if hasattr(config, key)}
    setattr(owner, attribute, torch.nn.ModuleList(list(modules)[:keep]))
    try:
        if "num_hidden_layers" in saved:
            config.num_hidden_layers = keep
        if isinstance(saved.get("layer_types"), (list, tuple)):
            config.layer_types = list(saved["layer_types"])[:keep]
        yield
    finally:
        setattr(owner, attribute, modules)
        for key, value in saved.items():
            setattr(config, key, value)
