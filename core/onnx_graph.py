"""ONNX graph helpers every floor above uses: who reads a tensor, node names, the PyTorch module a
node came from, and saving a model (with its tensors beside it when one protobuf cannot hold them).

``onnx`` is imported only where a model is saved; the rest read a ``ModelProto`` they are given.
"""

from __future__ import annotations

from pathlib import Path

from infopt.core.file_hash import copy_file, move_file
from infopt.core.manifest import EXTERNAL_DATA_BYTES
from infopt.core.threads import physical_cores


def consumers(graph) -> dict[str, list]:
    """Tensor name -> the nodes that read it."""
    found: dict[str, list] = {}
    for node in graph.node:
        for name in node.input:
            found.setdefault(name, []).append(node)
    return found


def ensure_node_names(model) -> None:
    """Give every node a unique name (the quantizers and the fallback name layers by node)."""
    seen: set[str] = set()
    for i, node in enumerate(model.graph.node):
        if not node.name or node.name in seen:
            node.name = f"{node.op_type}_{i}"
        seen.add(node.name)


TENSOR_ALIGN = 4096
"""offset of each large tensor in a tensors' file: a page, so ONNX Runtime maps it rather than reading a copy"""
WRITE_IN_FLIGHT_BYTES = 512 << 20
"""tensors computed as they are written and not yet written, at most (beyond one larger than this)"""
SCOPES = "pkg.torch.onnx.name_scopes"
"""the exporter's metadata key naming the PyTorch modules a node sits in"""


def module_path(node) -> str:
    """The PyTorch module a node came from, read off the exporter's metadata."""
    for prop in node.metadata_props:
        if prop.key == SCOPES:
            return scoped_module(prop.value)
    return ""


def scoped_module(scopes_text: str) -> str:
    """The innermost module named in the exporter's name-scopes text (``"['', 'model.layers.0.mlp', 'linear']"``)."""
    scopes = [s.strip(" '\"") for s in scopes_text.strip("[]").split(",")]
    named = [s for s in scopes[:-1] if s]
    return named[-1] if named else ""


def joined_modules(names: list[str]) -> str:
    """One name for the modules of a packed projection: ``layers.0.attn.q_proj+k_proj+v_proj`` (empty where one is
    unnamed)."""
    if not names or not all(names):
        return ""
    prefix = names[0].rsplit(".", 1)[0] + "." if "." in names[0] else ""
    if all(n.startswith(prefix) for n in names):
        return prefix + "+".join(n[len(prefix):] for n in names)
    return "+".join(names)


def drop_unused_ir_initializers(graph) -> None:
    """Remove the initializers no node reads and no output is, from an ``onnx_ir`` graph (after a rewrite)."""
    for value in list(graph.initializers.values()):
        if not value.uses() and not value.is_graph_output():
            graph.initializers.pop(value.name, None)


def drop_initializers(graph, names) -> None:
    """Remove the initializers named ``names`` in place, by index (``remove`` compares whole messages, and a large
    model's tensors are not copied)."""
    names = set(names)
    for index in reversed(range(len(graph.initializer))):
        if graph.initializer[index].name in names:
            del graph.initializer[index]


def save_model(model, dst: Path, external: bool | None = None) -> Path:
    """Save an ``onnx.ModelProto`` at ``dst``; a model over ``EXTERNAL_DATA_BYTES`` (or with ``external``) keeps its
    tensors in ``<name>.data`` beside it (one protobuf cannot exceed 2 GB)."""
    import onnx

    dst.parent.mkdir(parents=True, exist_ok=True)
    if external or (external is None and model.ByteSize() > EXTERNAL_DATA_BYTES):
        onnx.save(model, str(dst), save_as_external_data=True, location=dst.name + ".data")
    else:
        onnx.save(model, str(dst))
    return dst


def has_external_data(path: Path) -> bool:
    """Whether the model at ``path`` keeps any tensor in a file beside it (as models over 2 GB must)."""
    return bool(external_files(path))


def external_files(path: Path) -> set[str]:
    """The files beside the model at ``path`` that hold its tensors (none for a model that holds them all)."""
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    return {entry.value for t in model.graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL
            for entry in t.external_data if entry.key == "location"}


def load_graph(path: Path):
    """The model at ``path`` without the tensors it keeps beside it: kilobytes for a pass that changes only the
    graph. Save it with :func:`save_graph`, which puts those tensors beside the new file."""
    import onnx

    return onnx.load(str(path), load_external_data=False)


def save_graph(model, source: Path, dst: Path, *, move: bool = False) -> Path:
    """Save ``model``, loaded from ``source`` by :func:`load_graph` (its tensors' file still beside ``source``), at
    ``dst``, the tensors' file copied beside it as ``<dst name>.data`` (by the kernel, without reading the
    tensors into memory; with ``move``, moved: a rename where both lie on one file system) and the graph's
    references renamed to match. A model with every tensor inside it is saved as it is. (Not hard-linked:
    ``onnx.load`` refuses a tensors' file with several links.)"""
    import onnx

    dst.parent.mkdir(parents=True, exist_ok=True)
    entries = [entry for t in model.graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL
               for entry in t.external_data if entry.key == "location"]
    locations = {entry.value for entry in entries}
    names = {location: dst.name + ".data" if len(locations) == 1 else location for location in locations}
    place = move_file if move else copy_file
    for location, name in names.items():
        if Path(source).parent / location != dst.parent / name:
            place(Path(source).parent / location, dst.parent / name)
    for entry in entries:
        entry.value = names[entry.value]
    onnx.save(model, str(dst))
    return dst


def place_model(source: Path, dst: Path, *, move: bool = False) -> Path:
    """The ONNX model at ``source`` (and its tensors' file) at ``dst``, its tensors in ``<dst name>.data`` where
    it keeps them beside it: the files are copied (with ``move``, the tensors' file moved), and the graph's
    references renamed where the name changes."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    if not external_files(source):
        copy_file(source, dst)
    else:
        save_graph(load_graph(source), source, dst, move=move)
    return dst


def save_ir(model, dst: Path) -> Path:
    """Save an ``onnx_ir`` model at ``dst``. A model any of whose tensors lie in a file beside its source (a
    model over 2 GB, or one shipped so), or whose tensors pass ``EXTERNAL_DATA_BYTES``, gets its own
    ``<name>.data`` beside ``dst``: saved as they were, the tensors would name a file that is not beside ``dst``."""
    import onnx_ir as ir

    tensors = [v.const_value for v in model.graph.initializers.values() if v.const_value is not None]
    external = any(isinstance(t, ir.ExternalTensor) for t in tensors)
    if external or sum(t.nbytes for t in tensors) > EXTERNAL_DATA_BYTES:
        return save_ir_beside(model, dst)
    ir.save(model, str(dst))
    return dst


def save_ir_beside(model, dst: Path) -> Path:
    """Save an ``onnx_ir`` model at ``dst`` with its tensors in ``<name>.data``: each tensor past a megabyte at a
    page's offset, and the tensors computed as they are written (a stamped decoder's transposed and packed
    weights) made and written by a thread per core, at most :data:`WRITE_IN_FLIGHT_BYTES` of them held at once
    (Qwen2.5-0.5B's float32 build: 26.9-27.8 s with this writer, 30.6-35.0 s with onnx_ir's default, one tensor after
    the other). A lookup table is written in pieces (:data:`PIECE_BYTES`)."""
    import inspect

    import onnx_ir as ir

    options = {"alignment": TENSOR_ALIGN, "max_workers": physical_cores(), "max_in_flight_bytes": WRITE_IN_FLIGHT_BYTES}
    taken = inspect.signature(ir.save).parameters  # an onnx_ir without them: one after the other
    tables = _lookup_tables(model.graph)
    kept = {value: value.const_value for value in tables}
    try:
        for value in tables:
            value.const_value = _InPieces(value.const_value)
        ir.save(model, str(dst), external_data=dst.name + ".data", **{k: v for k, v in options.items() if k in taken})
    finally:
        for value, tensor in kept.items():
            value.const_value = tensor
    return dst


LOOKUPS = ("Gather", "GatherBlockQuantized")
"""ops that read a table a row at a time (an embedding), which ONNX Runtime maps from the file rather than copies"""
PIECE_BYTES = 64 << 10
"""a lookup table is written in pieces of this many bytes: the page cache then holds it in pieces that small, and a
lookup maps one into the process. Written whole, the table sat in pieces of up to 2 MB, and generating from
random token ids mapped 0.37 GB of Qwen2.5-0.5B's 0.55 GB embedding (64 KB pieces: 20 MB of a 0.55 GB file read
at 320 random rows; 1 MB: 0.24 GB)"""


def _lookup_tables(graph) -> list:
    """The initializers of ``graph`` (``onnx_ir``) that a lookup op reads as its table, large enough to be written
    beside the graph."""
    found = []
    for node in graph:
        table = node.inputs[0] if node.op_type in LOOKUPS and node.inputs else None
        if (table is not None and table.is_initializer() and table.const_value is not None
                and table.const_value.nbytes > PIECE_BYTES and table not in found):
            found.append(table)
    return found


class _InPieces:
    """A tensor written to a file :data:`PIECE_BYTES` at a time (its other attributes its own)."""

    def __init__(self, tensor):
        self._tensor = tensor

    def __getattr__(self, name):
        return getattr(self._tensor, name)

    def tofile(self, file) -> None:
        import numpy as np

        data = memoryview(np.ascontiguousarray(self._tensor.numpy()).reshape(-1).view(np.uint8))
        for start in range(0, len(data), PIECE_BYTES):
            file.write(data[start:start + PIECE_BYTES])
