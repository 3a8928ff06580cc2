"""A ``.safetensors`` file written tensor by tensor, each one's bytes straight from its memory.

``safetensors.torch.save_file`` turns every tensor into a ``bytes`` copy before it writes, so a checkpoint of
N bytes briefly holds 2N (more where a cast made the tensors first). Here the header (its 8-byte length, then
the JSON of each tensor's dtype, shape and byte range, padded with spaces to a multiple of 8) is written from
the shapes alone, and then each tensor, cast to ``floats`` where given a block at a time. A :class:`Deferred`
tensor is made only when its turn comes, so a writer whose tensors are computed (an INT4 layer's packed words)
holds one at a time.
"""

from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping, Union

import torch

DTYPES = {torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
          torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8",
          torch.bool: "BOOL", torch.float8_e4m3fn: "F8_E4M3", torch.float8_e5m2: "F8_E5M2"}
BLOCK_ELEMENTS = 1 << 24
"""elements cast and written at a time (64 MB of float32): a cast copy of a whole embedding was 272 MB at
Qwen2.5-0.5B's shape"""


@dataclass(frozen=True)
class Deferred:
    """A tensor made when it is written: its shape and dtype for the header, ``make`` for its values."""

    shape: tuple[int, ...]
    dtype: torch.dtype
    make: Callable[[], torch.Tensor]


Entry = Union[torch.Tensor, Deferred]


def write_safetensors(path: Path | str, tensors: Mapping[str, Entry], metadata: Mapping[str, str] | None = None,
                      floats: torch.dtype | None = None) -> int:
    """Write ``tensors`` (floating-point ones cast to ``floats`` where given) to ``path``; returns its bytes."""
    dtypes = {name: floats if floats is not None and t.dtype.is_floating_point else t.dtype for name, t in tensors.items()}
    header: dict = {"__metadata__": dict(metadata)} if metadata else {}
    offset = 0
    for name, t in tensors.items():
        if dtypes[name] not in DTYPES:
            raise ValueError(f"{name}: safetensors has no {dtypes[name]}")
        size = math.prod(t.shape) * dtypes[name].itemsize
        header[name] = {"dtype": DTYPES[dtypes[name]], "shape": list(t.shape), "data_offsets": [offset, offset + size]}
        offset += size
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text)
        for name, entry in tensors.items():
            t = entry.make() if isinstance(entry, Deferred) else entry
            if tuple(t.shape) != tuple(entry.shape) or t.dtype != entry.dtype:
                raise ValueError(f"{name} was declared {entry.dtype} {list(entry.shape)} and made {t.dtype} "
                                 f"{list(t.shape)}")
            _write_values(f, t.detach().to("cpu").contiguous().reshape(-1), dtypes[name])
            del t
    return 8 + len(text) + offset


def _write_values(f, flat: torch.Tensor, dtype: torch.dtype) -> None:
    for start in range(0, flat.numel(), BLOCK_ELEMENTS):
        block = flat[start:start + BLOCK_ELEMENTS].to(dtype)
        f.write(memoryview(block.view(torch.uint8).numpy()))
