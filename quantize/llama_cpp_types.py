"""The storage type llama.cpp's ``Q4_K_M`` gives each weight of a decoder, and what those types cost in bits.

INT4 text generation takes the size of the model's ``Q4_K_M`` file, every table counted, as its default size target:
the mix LLM users on a CPU pick, read from llama.cpp's rules (``llama_tensor_get_type`` in ``llama-quant.cpp``):

- every weight ``Q4_K`` (4.5 bits: 4-bit codes, a 6-bit scale and minimum per 32, two 16-bit factors per 256);
- the output head, or a tied embedding that serves as one, ``Q6_K``;
- the attention's value and the MLP's down projection ``Q6_K`` in the first and last eighth of the layers and
  in every third between (:func:`more_bits`);
- a k-quant needs rows of a multiple of 256: a narrower row falls back, ``Q4_K`` to ``Q5_0`` and ``Q6_K`` to ``Q8_0``
  (SmolLM2's 576-wide rows: most of its file is ``Q5_0``, 5.5 bits).
"""

from __future__ import annotations

from dataclasses import dataclass

BITS = {"Q4_K": 4.5, "Q5_0": 5.5, "Q5_1": 6.0, "Q5_K": 5.5, "Q6_K": 6.5625, "Q8_0": 8.5}
"""bits per weight of each type, its scales and minimums counted (``ggml-common.h``'s block sizes)"""
SUPER_BLOCK = 256
"""weights a k-quant's row holds in whole super-blocks"""
FALLBACK = {"Q4_K": "Q5_0", "Q5_K": "Q5_1", "Q6_K": "Q8_0"}
"""the type a k-quant falls back to for a row that is not a whole number of super-blocks"""
VALUE_ROLES = ("v_proj", "value", "attn.v")
DOWN_ROLES = ("down_proj", "mlp.c_proj", "mlp.fc2", "dense_4h_to_h", "mlp.down")
"""module path endings of the attention's value and the MLP's down projection, as transformers' families name them"""


def more_bits(layer: int, layers: int) -> bool:
    """llama.cpp's ``use_more_bits``: the first and last eighth of the layers, and every third between."""
    return layer < layers // 8 or layer >= 7 * layers // 8 or (layer - layers // 8) % 3 == 2


def q4_k_m_type(path: str, layer: int | None, layers: int, in_features: int, head: bool = False) -> str:
    """The type ``Q4_K_M`` stores the weight at ``path`` in (``layer`` of ``layers`` in the decoder, None outside
    it; ``head``: the output head, or a tied embedding)."""
    kind = "Q4_K"
    if head:
        kind = "Q6_K"
    elif layer is not None and path.endswith((*VALUE_ROLES, *DOWN_ROLES)) and more_bits(layer, layers):
        kind = "Q6_K"
    return FALLBACK[kind] if in_features % SUPER_BLOCK else kind


@dataclass(frozen=True)
class Tensor:
    """One weight table of the model: its path, parameters, input features, decoder layer (None outside), and
    whether it is the output head (or a tied embedding serving as one)."""

    path: str
    parameters: int
    in_features: int
    layer: int | None = None
    head: bool = False


def q4_k_m_bits(tensors: list[Tensor]) -> float:
    """The bits per parameter of ``Q4_K_M`` over ``tensors``, each stored in :func:`q4_k_m_type`'s type."""
    layers = 1 + max((t.layer for t in tensors if t.layer is not None), default=-1)
    total = sum(t.parameters * BITS[q4_k_m_type(t.path, t.layer, layers, t.in_features, t.head)] for t in tensors)
    return total / max(sum(t.parameters for t in tensors), 1)
