"""A ``.safetensors`` file written tensor by tensor, each one's bytes straight from its memory.

``safetensors.torch.save_file`` turns every tensor into a ``bytes`` copy before it writes, so a checkpoint of
N bytes briefly holds 2N (more where a cast made the tensors first). Here the header (its 8-byte length, then
the JSON of each tensor's dtype, shape and byte range, padded with spaces to a multiple of 8) is written from
the shapes alone, and then each tensor, cast to ``floats`` where given and the cast let go once written.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Mapping

import torch

DTYPES = {torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
          torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8",
          torch.bool: "BOOL", torch.float8_e4m3fn: "F8_E4M3", torch.float8_e5m2: "F8_E5M2"}


def write_safetensors(path: Path | str, tensors: Mapping[str, torch.Tensor], metadata: Mapping[str, str] | None = None,
                      floats: torch.dtype | None = None) -> int:
    """Write ``tensors`` (floating-point ones cast to ``floats`` where given) to ``path``; returns its bytes."""
    dtypes = {name: floats if floats is not None and t.is_floating_point() else t.dtype for name, t in tensors.items()}
    header: dict = {"__metadata__": dict(metadata)} if metadata else {}
    offset = 0
    for name, t in tensors.items():
        if dtypes[name] not in DTYPES:
            raise ValueError(f"{name}: safetensors has no {dtypes[name]}")
        size = t.numel() * dtypes[name].itemsize
        header[name] = {"dtype": DTYPES[dtypes[name]], "shape": list(t.shape), "data_offsets": [offset, offset + size]}
        offset += size
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text)
        for name, t in tensors.items():
            data = t.detach().to("cpu", dtypes[name]).contiguous().reshape(-1)
            if data.numel():
                f.write(memoryview(data.view(torch.uint8).numpy()))
            del data
    return 8 + len(text) + offset
