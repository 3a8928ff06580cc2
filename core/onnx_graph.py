"""ONNX graph helpers every floor above uses: who reads a tensor, node names, the PyTorch module a
node came from, and saving a model (with its tensors beside it when one protobuf cannot hold them).

``onnx`` is imported only where a model is saved; the rest read a ``ModelProto`` they are given.
"""

from __future__ import annotations

from pathlib import Path

from infopt.core.file_hash import copy_file, move_file
from infopt.core.manifest import EXTERNAL_DATA_BYTES


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


def module_path(node) -> str:
    """The PyTorch module a node came from, read off the exporter's metadata."""
    for prop in node.metadata_props:
        if prop.key == "pkg.torch.onnx.name_scopes":
            scopes = [s.strip(" '\"") for s in prop.value.strip("[]").split(",")]
            named = [s for s in scopes[:-1] if s]
            return named[-1] if named else ""
    return ""


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
        ir.save(model, str(dst), external_data=dst.name + ".data")
    else:
        ir.save(model, str(dst))
    return dst
