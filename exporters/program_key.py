"""What a compiled form of an ``ExportedProgram`` depends on, as hashable parts, for the caches of
the passes that lower one (``onnx_export``, ``aoti_compile``): the program as printed without its
comments (every node with its dtypes and symbolic shapes, the signature, the dims' ranges), each node's source location
and module path (exporters write both into the files they make), and every weight and constant."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable


def program_parts(program: Any) -> list[str | bytes]:
    import torch

    nodes = repr([(n.name, n.meta.get("stack_trace"), n.meta.get("nn_module_stack")) for n in program.graph.nodes])
    parts: list[str | bytes] = [_code(program), nodes]
    for name, value in [*sorted(program.state_dict.items()), *sorted(program.constants.items())]:
        if isinstance(value, torch.Tensor):
            data = value.detach().cpu().contiguous()
            parts += [name, str(data.dtype), repr(tuple(data.shape)), data.reshape(-1).view(torch.uint8).numpy().tobytes()]
        else:
            parts += [name, repr(value)]
    return parts


def _code(program: Any) -> str:
    """The program as printed, less its comment and blank lines: the source locations they quote are hashed
    from the nodes, and the annotations that torch's exporters add to nodes without a source line
    (when the ONNX candidate of the same build exports this very program) must not change the key."""
    return "\n".join(line for line in str(program).splitlines() if line.strip() and not line.lstrip().startswith("#"))


def source_of(*modules: Any) -> bytes:
    """The source of the given modules (the pass's own code): a changed pass is another key."""
    return b"".join(Path(m.__file__).read_bytes() for m in modules)


def key_or_none(make: Callable[[], str]) -> str | None:
    """``make()``, or None (lower the program, keep nothing) for a program whose parts cannot be hashed
    (an unusual tensor type or constant): a cache is never a reason for a build to fail."""
    try:
        return make()
    except Exception:  # noqa: BLE001 - any failure to hash means only: no cache
        return None
