"""Artifact: one model in one representation, its files, its InputSpec and its lineage."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from infopt.core.inputspec import InputSpec
from infopt.core.lineage import PassRecord
from infopt.core.manifest import model_bytes

Representation = Literal["torch", "exported", "onnx", "aoti", "tensorrt"]
STAGE: dict[str, int] = {"torch": 0, "exported": 1, "onnx": 2, "aoti": 2, "tensorrt": 3}
"""How far down the flow each representation is; a pass never moves a model back up."""


@dataclass
class Artifact:
    """A model in one representation.

    ``obj`` holds the in-memory form (an ``nn.Module``, an ``ExportedProgram``); ``path`` the
    file form (an ``.onnx`` file). At least one is set.
    """

    kind: Representation
    spec: InputSpec
    path: Path | None = None
    obj: Any = None
    output_names: tuple[str, ...] = ()
    lineage: list[PassRecord] = field(default_factory=list)
    attachments: dict[str, Path] = field(default_factory=dict)
    """Extra files that ship with the model, by their path in the output folder."""
    products: dict[type, Any] = field(default_factory=dict)
    """In-memory results of a pass that later passes read or a server's emitter writes out at the end of the
    build, keyed by their type: ``CheckpointSource`` (the quantized Hugging Face module behind vLLM's 4-bit
    checkpoint), ``KvDecoder`` (a captured decoder's cache layout), ``GenaiFolder`` (the folder the build judged)."""

    @property
    def has_python_module(self) -> bool:
        """Whether the model is an ``nn.Module`` with Python layers (not TorchScript, ``.pt2`` or ONNX)."""
        if self.kind != "torch" or self.obj is None:
            return False
        import torch

        return isinstance(self.obj, torch.nn.Module) and not isinstance(self.obj, torch.jit.ScriptModule)

    def size_bytes(self) -> int | None:
        """Bytes on disk (with external data) for a file, bytes of weights for an in-memory model."""
        if self.path is not None and self.path.exists():
            return model_bytes(self.path)
        state = getattr(self.obj, "state_dict", None)
        if state is None:
            return None
        tensors = state() if callable(state) else state
        seen, total = set(), 0
        for tensor in tensors.values():
            if hasattr(tensor, "untyped_storage"):
                ptr = tensor.untyped_storage().data_ptr()
                if ptr not in seen:
                    seen.add(ptr)
                    total += tensor.untyped_storage().nbytes()
        return total

    def derive(self, kind: Representation, *, path: Path | None = None, obj: Any = None,
               output_names: tuple[str, ...] | None = None, spec: InputSpec | None = None) -> "Artifact":
        """The next artifact down the flow, keeping this one's spec, output names and lineage."""
        return Artifact(kind, spec or self.spec, path, obj,
                        self.output_names if output_names is None else output_names, list(self.lineage),
                        dict(self.attachments), dict(self.products))
