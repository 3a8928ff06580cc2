"""Rewriting a large ONNX model without holding its tensors: the graph in memory, the tensors streamed.

A pass that changes the graph and a few tensors (the decoder's projections packed, each pack the concatenation
of three or two weights) loaded every tensor of the model, built the new ones as protobuf copies and saved it
all again: at Qwen2.5-0.5B in float32, 2 GB read, copied three times and written (about 9 s, and the weights'
size held at the pass's peak). :class:`TensorFile` keeps the source's tensors in its file: a pass reads the ones
it needs as memory-mapped arrays (:meth:`TensorFile.array`), writes each new one into the new tensors' file at
once (:meth:`TensorFile.add`), and :meth:`TensorFile.save` copies the tensors the graph still reads into that
file (by the kernel where it can) and writes the graph beside it. The few small tensors (shapes, norms' weights,
biases) are read into the graph, where the graph passes that read them expect them.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from infopt.core.file_hash import move_file
from infopt.core.onnx_graph import TENSOR_ALIGN, save_model

ALIGN = TENSOR_ALIGN
"""offset of each large tensor in the new file (:data:`~infopt.core.onnx_graph.TENSOR_ALIGN`)"""
INLINE_BYTES = 1 << 20
"""tensors under this many bytes are kept in the graph itself"""
UNREAD_SHARE = 0.01
"""a source's tensors' file is taken over only where the new graph reads all but this share of its bytes (the rest,
tensors the rewrite dropped or read into the graph, would stay in the file unread)"""


class InMemoryTensors:
    """The same calls on a model that holds all its tensors (a small model, saved whole at ``dst``)."""

    def __init__(self, model=None, dst: Path | None = None):
        self.model, self.dst = model, dst

    def __enter__(self) -> "InMemoryTensors":
        return self

    def __exit__(self, *_) -> None:
        return None

    def save(self) -> Path:
        return save_model(self.model, self.dst)

    def give_back(self) -> None:
        """Nothing was taken (see :meth:`TensorFile.give_back`)."""
        return None

    def array(self, tensor) -> np.ndarray:
        from onnx import numpy_helper

        return numpy_helper.to_array(tensor)

    def add(self, graph, array: np.ndarray, name: str) -> None:
        from onnx import numpy_helper

        graph.initializer.append(numpy_helper.from_array(np.ascontiguousarray(array), name))


class TensorFile(InMemoryTensors):
    """A model loaded without its tensors (``onnx.load(..., load_external_data=False)``) from ``source``, to be
    saved at ``dst`` with its tensors in ``<dst name>.data``. Use it as a context manager: a failure removes the
    half-written tensors' file.

    With ``take_over`` (a source in a work folder that nothing reads after this pass), a rewrite that adds no
    tensor and still reads nearly every byte of the source's one tensors' file moves that file to be the new one,
    its offsets kept, rather than copying it (a stamped decoder's projections are packed as it is written, so
    ``fuse_decoder`` changes only its graph: 6 GB copied at Qwen2.5-1.5B's float32 shape, 3.7 s).
    :meth:`give_back` moves it back where the rewrite is not kept."""

    def __init__(self, model, source: Path, dst: Path, take_over: bool = False):
        super().__init__(model, Path(dst))
        self.take_over = take_over
        self.taken_from: Path | None = None
        self.source_dir = Path(source).parent
        self.data_path = self.dst.with_name(self.dst.name + ".data")
        self.dst.parent.mkdir(parents=True, exist_ok=True)
        self._out = open(self.data_path, "wb")
        self._sources: dict[str, Any] = {}
        self._written: set[str] = set()
        self._inline_small()

    def __exit__(self, kind, *_) -> None:
        for src in self._sources.values():
            src.close()
        if not self._out.closed:
            self._out.close()
        if kind is not None:
            if self.taken_from is not None:
                self.give_back()
            else:
                self.data_path.unlink(missing_ok=True)

    def array(self, tensor) -> np.ndarray:
        """``tensor``'s values, memory-mapped from the source's file when they are there (nothing read yet)."""
        from onnx import TensorProto, helper

        if tensor.data_location != TensorProto.EXTERNAL or tensor.name in self._written:
            return super().array(tensor)
        where = _external(tensor)
        return np.memmap(self.source_dir / where["location"], dtype=helper.tensor_dtype_to_np_dtype(tensor.data_type),
                         mode="r", offset=int(where.get("offset", 0)), shape=tuple(tensor.dims))

    def add(self, graph, array: np.ndarray, name: str) -> None:
        """A new initializer ``name``; a large one's bytes are written into the new tensors' file now."""
        from onnx import helper

        array = np.ascontiguousarray(array)
        if array.nbytes < INLINE_BYTES:
            return super().add(graph, array, name)
        tensor = graph.initializer.add()
        tensor.name, tensor.data_type = name, helper.np_dtype_to_tensor_dtype(array.dtype)
        tensor.dims.extend(array.shape)
        offset = self._aligned()
        self._out.write(memoryview(array).cast("B"))
        _point(tensor, self.data_path.name, offset, array.nbytes)
        self._written.add(name)

    def save(self) -> Path:
        """Copy the source's tensors the graph still reads into the new file (or take the file over), and write the
        graph beside it."""
        import onnx

        if self._taken_over():
            onnx.save(self.model, str(self.dst))
            return self.dst
        for tensor in self.model.graph.initializer:
            if tensor.name in self._written:
                continue
            if tensor.data_location != onnx.TensorProto.EXTERNAL:
                if len(tensor.raw_data) >= INLINE_BYTES:  # one a graph pass folded: beside the graph too
                    offset = self._aligned()
                    self._out.write(tensor.raw_data)
                    _point(tensor, self.data_path.name, offset, len(tensor.raw_data))
                continue
            src, start, length = self._where(tensor)
            offset = self._aligned()
            _copy_range(src, start, self._out, length)
            _point(tensor, self.data_path.name, offset, length)
        self._out.close()
        onnx.save(self.model, str(self.dst))
        return self.dst

    def give_back(self) -> None:
        """The source's tensors' file moved back where it was taken from (the rewrite is not kept)."""
        if self.taken_from is not None:
            move_file(self.data_path, self.taken_from)
            self.taken_from = None

    def _taken_over(self) -> bool:
        """Where :attr:`take_over` allows it, the source's tensors' file moved to be the new one and the graph
        pointed at it; False where the tensors are to be copied."""
        from onnx import TensorProto

        initializers = self.model.graph.initializer
        external = [t for t in initializers if t.data_location == TensorProto.EXTERNAL]
        locations = {_external(t)["location"] for t in external}
        if (not self.take_over or self._written or len(locations) != 1
                or any(len(t.raw_data) >= INLINE_BYTES for t in initializers if t.data_location != TensorProto.EXTERNAL)):
            return False
        source = self.source_dir / locations.pop()
        if sum(self._where(t)[2] for t in external) < (1 - UNREAD_SHARE) * source.stat().st_size:
            return False
        self._out.close()
        self.data_path.unlink()
        move_file(source, self.data_path)
        self.taken_from = source
        for tensor in external:
            entry = next(e for e in tensor.external_data if e.key == "location")
            entry.value = self.data_path.name
        return True

    def _aligned(self) -> int:
        offset = self._out.tell()
        pad = -offset % ALIGN
        if pad:
            self._out.write(b"\0" * pad)
        return offset + pad

    def _where(self, tensor) -> tuple[Any, int, int]:
        """The open source file holding ``tensor`` (each file opened once), its offset and its length."""
        where = _external(tensor)
        src = self._sources.get(where["location"])
        if src is None:
            src = self._sources[where["location"]] = open(self.source_dir / where["location"], "rb")
        start = int(where.get("offset", 0))
        length = int(where["length"]) if "length" in where else os.fstat(src.fileno()).st_size - start
        return src, start, length

    def _inline_small(self) -> None:
        """Read the source's small tensors into the graph."""
        from onnx import TensorProto

        for tensor in self.model.graph.initializer:
            if tensor.data_location == TensorProto.EXTERNAL:
                src, start, length = self._where(tensor)
                if length < INLINE_BYTES:
                    src.seek(start)
                    tensor.raw_data = src.read(length)
                    tensor.data_location = TensorProto.DEFAULT
                    del tensor.external_data[:]


def tensor_store(model, source: Path, dst: Path, take_over: bool = False) -> InMemoryTensors:
    """Where ``model`` (loaded from ``source`` without its tensors) keeps tensors beside its graph, a
    :class:`TensorFile` that streams them to ``dst``'s own file (``take_over``: see there); else the model saved
    whole at ``dst``."""
    from onnx import TensorProto

    if any(t.data_location == TensorProto.EXTERNAL for t in model.graph.initializer):
        return TensorFile(model, source, dst, take_over)
    return InMemoryTensors(model, dst)


def _external(tensor) -> dict[str, str]:
    return {entry.key: entry.value for entry in tensor.external_data}


def _point(tensor, location: str, offset: int, length: int) -> None:
    from onnx import TensorProto

    tensor.ClearField("raw_data")
    tensor.data_location = TensorProto.EXTERNAL
    del tensor.external_data[:]
    for key, value in (("location", location), ("offset", str(offset)), ("length", str(length))):
        entry = tensor.external_data.add()
        entry.key, entry.value = key, value


def _copy_range(src, offset: int, out, length: int) -> None:
    """``length`` bytes of ``src`` from ``offset`` appended to ``out``: by the kernel (``copy_file_range``) where
    the file systems allow, else read and written in chunks."""
    out.flush()
    done = 0
    if hasattr(os, "copy_file_range"):
        try:
            while done < length:
                sent = os.copy_file_range(src.fileno(), out.fileno(), length - done, offset + done)
                if sent == 0:
                    break
                done += sent
        except OSError:
            pass
    out.seek(0, os.SEEK_END)
    src.seek(offset + done)
    while done < length:
        chunk = src.read(min(64 << 20, length - done))
        if not chunk:
            raise OSError(f"{src.name} ends before the tensor at {offset} ({length} bytes) does")
        out.write(chunk)
        done += len(chunk)
