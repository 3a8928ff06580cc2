"""What a build of a checkpoint needs in memory, read from the checkpoint before anything is loaded.

A model that does not fit used to be found out late: the kernel's OOM killer ended the build while it quantized,
and nothing was printed. Here the
checkpoint's size is read from its safetensors headers (a few kilobytes each: the parameter count and the
dtype of every tensor, nothing loaded), the build's peak is estimated from it, and a build whose estimate
exceeds the memory this machine has available is refused with exit 2 before any work, saying what it needs.

The estimate is a line through what builds measured (``benchmarks/bench_scale.py``, random weights in
Qwen2.5's and Llama-3.1's configs; the figures are in benchmarks/results/rules.md): a fixed part (the interpreter
with torch, transformers and ONNX Runtime imported, and the export's own working memory) plus a multiple of the
weights, in fp32 or as stored. The lines lie at or above the peaks measured (peak RSS, the checkpoint's
memory-mapped pages included).
``INFOPT_SKIP_MEMORY_CHECK=1`` builds anyway.
"""

from __future__ import annotations

import json
import os
import struct
from dataclasses import dataclass
from pathlib import Path

from infopt.core.errors import TooLargeError
from infopt.runtime import hub

FOOTPRINTS = {"float": (1.6e9, 3.6, "fp32"), "fp32 text generation": (1.6e9, 1.2, "fp32"),
              "int4 in place": (3.4e9, 1.3, "fp32"), "int4 in place, bf16": (1.6e9, 1.0, "stored")}
"""how a build holds its weights -> (fixed bytes, multiple, of which bytes: the weights in fp32 or as stored) of
its peak. An INT4 build of a bf16 checkpoint keeps it in bf16 (``int4 in place, bf16``), one of another dtype
widens it to fp32 (``int4 in place``). ``fp32 text generation`` is an fp32 build whose ONNX passes change only
the graph (weights past 256 MB beside it) and which widens a bf16 checkpoint one tensor at a time; ``float`` is
the older line, kept for INT8 and logits builds. The peaks each line was drawn through are in
benchmarks/results/rules.md."""
SKIP_ENV = "INFOPT_SKIP_MEMORY_CHECK"
DTYPE_BYTES = {"F64": 8, "I64": 8, "U64": 8, "F32": 4, "I32": 4, "U32": 4, "F16": 2, "BF16": 2, "I16": 2, "U16": 2,
               "F8_E4M3": 1, "F8_E5M2": 1, "I8": 1, "U8": 1, "BOOL": 1}


@dataclass
class CheckpointSize:
    """A checkpoint's weights as its files declare them."""

    parameters: int
    bytes: int
    dtype: str
    """the dtype most of its bytes are in (``BF16``, ``F32``, ...)"""

    def describe(self) -> str:
        return f"{self.parameters / 1e9:.2f}B parameters, {self.bytes / 1e9:.1f} GB of {self.dtype.lower()} weights"


def header(path: Path) -> dict:
    """The JSON header of a safetensors file: each tensor's dtype, shape and byte range."""
    with path.open("rb") as f:
        (length,) = struct.unpack("<Q", f.read(8))
        if length > 100 * 2**20:
            raise ValueError(f"{path.name}: a safetensors header of {length} bytes")
        return json.loads(f.read(length))


def checkpoint_size(folder: Path) -> CheckpointSize | None:
    """The weights of a model folder's ``*.safetensors`` files, from their headers; None when it has none
    (or one cannot be read: the build's loader says what is wrong with it)."""
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        return None
    parameters, by_dtype = 0, {}
    try:
        for path in files:
            for name, tensor in header(path).items():
                if name == "__metadata__":
                    continue
                count = 1
                for dim in tensor["shape"]:
                    count *= int(dim)
                parameters += count
                by_dtype[tensor["dtype"]] = by_dtype.get(tensor["dtype"], 0) + count * DTYPE_BYTES.get(tensor["dtype"], 4)
    except (OSError, ValueError, KeyError, TypeError, struct.error):
        return None
    return CheckpointSize(parameters, sum(by_dtype.values()), max(by_dtype, key=by_dtype.get) if by_dtype else "F32")


def available_bytes() -> int | None:
    """The memory this process may still take: the kernel's MemAvailable, less where a cgroup limit (a
    container's) leaves less; None where neither can be read."""
    found = []
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                found.append(int(line.split()[1]) * 1024)
    except OSError:
        pass
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        if limit != "max":
            found.append(int(limit) - int(Path("/sys/fs/cgroup/memory.current").read_text()))
    except (OSError, ValueError):
        pass
    return min(found) if found else None


def estimate_bytes(size: CheckpointSize, footprint: str = "float") -> int:
    """The peak memory of a build that holds its weights as ``footprint`` says (:data:`FOOTPRINTS`), estimated from
    its checkpoint (see the module doc)."""
    if footprint == "int4 in place" and size.dtype == "BF16":
        footprint = "int4 in place, bf16"
    fixed, factor, basis = FOOTPRINTS[footprint]
    return int(fixed + factor * (size.bytes if basis == "stored" else 4 * size.parameters))


def model_folder(model: str | Path) -> Path | None:
    """The folder of a model given as a folder or a hub id (its cached snapshot); None for a file."""
    if Path(model).is_dir():
        return Path(model)
    if hub.is_hub_id(model):
        try:
            return hub.snapshot(str(model)).folder
        except Exception:  # noqa: BLE001 - the build's loader reports what is wrong with the id
            return None
    return None


def check_fits(model: str | Path, what: str, footprint: str = "float") -> CheckpointSize | None:
    """Refuse (``TooLargeError``, exit 2) a build of ``model`` (a folder or hub id; a file is not checked) whose
    estimated peak exceeds the memory available here; ``what`` names the build (``an int4 text-generation build``),
    ``footprint`` how it holds its weights (:data:`FOOTPRINTS`)."""
    folder = model_folder(model)
    if folder is None:
        return None
    size = checkpoint_size(folder)
    available = available_bytes()
    if size is None or available is None or os.environ.get(SKIP_ENV) == "1":
        return size
    need = estimate_bytes(size, footprint)
    if need > available:
        raise TooLargeError(
            f"{what} of {folder.name} ({size.describe()}) needs about {need / 1e9:.0f} GB of memory; this machine "
            f"has {available / 1e9:.1f} GB available", where=str(folder),
            fix=f"build on a machine with at least {need / 1e9:.0f} GB free, or a smaller model; {SKIP_ENV}=1 "
                "builds anyway (the kernel may then kill the build)")
    return size
