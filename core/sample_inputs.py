"""Random inputs that fit an InputSpec: for capture, forward checks and the fallback validation."""

from __future__ import annotations

from typing import Any, Mapping, Union

import numpy as np

from infopt.core.errors import InputSpecError
from infopt.core.inputspec import InputSpec

IdHigh = Union[int, Mapping[str, int]]
"""how high random integer inputs go: one bound for all, or one per input name (the rest: ``DEFAULT_ID_HIGH``)"""
DEFAULT_ID_HIGH = 2

NUMPY_DTYPES = {"float32": np.float32, "float16": np.float16, "float64": np.float64, "int64": np.int64,
                "int32": np.int32, "int16": np.int16, "int8": np.int8, "uint8": np.uint8, "bool": np.bool_}


def random_feed(spec: InputSpec, *, seed: int = 0, int_high: IdHigh = DEFAULT_ID_HIGH, pick: str = "opt",
                **dims: int) -> dict[str, np.ndarray]:
    """One batch of seeded random inputs: floats ~ N(0, 1), integers in [0, int_high) (``int_high`` by
    input name where it is a mapping), an integer input named ``*mask`` all ones."""
    rng = np.random.default_rng(seed)
    feed = {}
    for tensor in spec.inputs:
        shape = spec.concrete_shape(tensor, pick, **dims)
        if tensor.dtype in ("float32", "float16", "float64"):
            feed[tensor.name] = rng.standard_normal(shape).astype(NUMPY_DTYPES[tensor.dtype])
        elif tensor.dtype == "bfloat16":
            raise InputSpecError(f"input {tensor.name} is bfloat16, which numpy cannot hold",
                                 fix="declare it float32 in --input and cast inside the model")
        elif tensor.dtype == "bool":
            feed[tensor.name] = rng.integers(0, 2, shape).astype(np.bool_)
        elif tensor.name.endswith("mask"):
            # an attention mask is 0/1, and some models compute positions from it (OPT: its cumulative
            # sum), so random ids there index past their tables: every position attended
            feed[tensor.name] = np.ones(shape, NUMPY_DTYPES[tensor.dtype])
        else:
            high = int_high.get(tensor.name, DEFAULT_ID_HIGH) if isinstance(int_high, Mapping) else int_high
            feed[tensor.name] = rng.integers(0, high, shape).astype(NUMPY_DTYPES[tensor.dtype])
    return feed


def capture_feed(spec: InputSpec, **kwargs: Any) -> dict[str, np.ndarray]:
    """Inputs for tracing: dynamic dims at their opt size but never 1, so torch.export does not
    specialize them (it treats sizes 0 and 1 as static)."""
    sizes = {s: max(2, r.opt) if r.max >= 2 else r.opt for s, r in spec.dims.items()}
    return random_feed(spec, **sizes, **kwargs)


def id_high(module: Any) -> IdHigh:
    """How high random integer inputs may go: the module's own ``id_high`` where it says (a Hugging
    Face text model: its word-embedding table for ``input_ids``, so ids span the vocabulary, and its
    token-type table for ``token_type_ids``), else the smallest ``nn.Embedding`` table size in it, a
    safe upper bound for any id input (2 where it has none)."""
    own = getattr(module, "id_high", None)
    if (isinstance(own, Mapping) and own) or (isinstance(own, int) and own > 0):
        return own
    try:
        import torch
    except ImportError:  # pragma: no cover
        return DEFAULT_ID_HIGH
    sizes = [m.num_embeddings for m in getattr(module, "modules", lambda: [])() if isinstance(m, torch.nn.Embedding)]
    return min(sizes) if sizes else DEFAULT_ID_HIGH
