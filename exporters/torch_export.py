"""Capture: an ``nn.Module`` or TorchScript module into an ``ExportedProgram`` with torch.export.

The InputSpec's symbolic dims become ``torch.export.Dim``s with their min/max, so the captured
graph (and everything lowered from it) accepts the whole range. When capture fails, the error
names the module and the source line that stopped it and says what to change.
"""

from __future__ import annotations

import linecache
import sys
import traceback
from pathlib import Path

from infopt.core.errors import CaptureError
from infopt.core.inputspec import InputSpec, dtype_name
from infopt.core.logs import quiet_third_party
from infopt.core.sample_inputs import capture_feed, id_high
from infopt.exporters.torchscript_graph import to_graph_module


def dynamic_shapes(spec: InputSpec):
    """Per input (in order) a dict axis -> ``torch.export.Dim`` for each symbolic dim."""
    from torch.export import Dim

    dims = {name: Dim(name, min=r.min, max=r.max) for name, r in spec.dims.items()}
    return tuple({i: dims[d] for i, d in enumerate(t.shape) if isinstance(d, str)} or None for t in spec.inputs)


def example_tensors(spec: InputSpec, module=None) -> tuple:
    import torch

    feed = capture_feed(spec, int_high=id_high(module))
    return tuple(torch.from_numpy(feed[n]) for n in spec.names)


def export_module(module, spec: InputSpec, *, strict: bool = False, dynamic: bool = True):
    """torch.export ``module`` for ``spec``; a capture failure becomes a ``CaptureError``."""
    import torch

    args = example_tensors(spec, module)
    shapes = dynamic_shapes(spec) if dynamic else None
    if shapes is not None and _takes_varargs(module):
        shapes = (shapes,)  # torch.export matches dynamic_shapes to forward's parameters: ``*args`` is one
    try:
        with quiet_third_party():
            if isinstance(module, torch.jit.ScriptModule):
                module = to_graph_module(module, args)
            return torch.export.export(module, args, dynamic_shapes=shapes, strict=strict)
    except Exception as exc:  # noqa: BLE001 - torch raises many types here; all mean capture failed
        if UNPROVEN_GUARD in str(exc):
            try:
                with quiet_third_party():
                    return torch.export.export(module, args, dynamic_shapes=shapes, strict=strict,
                                               prefer_deferred_runtime_asserts_over_guards=True)
            except Exception:  # noqa: BLE001 - the first failure is the one to report
                pass
        raise capture_error(exc, module, spec) from exc


UNPROVEN_GUARD = "satisfy the generated guard"
"""torch.export's words for a guard on a dynamic dim it could not prove over the declared range.
Some hold over the whole range and torch's range analysis cannot show it (wav2vec2's feature
encoder in bf16: ``1 % (1 + (samples // 5 - 5) // 4) != 0``, true for every ``samples >= 30``);
capture is then retried with the guard checked at run time instead, and the build's range-ends
check runs the model at both ends of every range. A dim the code fixes to one value is not retried."""


def _takes_varargs(module) -> bool:
    """Whether ``forward`` takes its inputs as ``*args`` (wrappers such as the precision cast do)."""
    import inspect

    try:
        params = list(inspect.signature(module.forward).parameters.values())
    except (TypeError, ValueError):
        return False
    return bool(params) and params[0].kind is inspect.Parameter.VAR_POSITIONAL


def capture_error(exc: Exception, module, spec: InputSpec) -> CaptureError:
    """A CaptureError naming the user's module and source line, and what to change."""
    message = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    where = user_frame(exc, module)
    text = str(exc)
    if "data-dependent" in text or "GuardOnDataDependent" in type(exc).__name__ or "data dependent" in text:
        what = "the model branches on the values of a tensor (data-dependent control flow)"
        fix = ("make the branch independent of tensor values (torch.where, masking), move it out of forward, "
               "or express it with torch.cond")
    elif "Constraints violated" in text or "specializ" in text:
        what = f"a dim declared dynamic is fixed by the model's code ({message})"
        fix = f"declare that dim as an int in --input, or remove the code that fixes it; the spec was {spec}"
    else:
        what = f"{type(exc).__name__}: {message[:300]}"
        fix = "rewrite the construct torch.export cannot trace, or save the model as ONNX and build from that"
    return CaptureError(f"torch.export could not capture the model: {what}", where=where, fix=fix)


def user_frame(exc: BaseException, module) -> str | None:
    """The deepest frame outside torch and infopt: the user's module and line."""
    import torch

    torch_dir = str(Path(torch.__file__).parent)
    infopt_dirs = _package_dirs()
    names = {id(m): n or "(root)" for n, m in getattr(module, "named_modules", lambda: [])()}
    best = None
    for err in _chain(exc):
        for frame, lineno in traceback.walk_tb(err.__traceback__):
            filename = frame.f_code.co_filename
            if filename.startswith((torch_dir, *infopt_dirs)) or "site-packages" in filename or filename.startswith("<"):
                continue
            owner = frame.f_locals.get("self")
            path = names.get(id(owner))
            label = f"{type(owner).__name__} at {path}" if path else frame.f_code.co_name
            source = linecache.getline(filename, lineno).strip()
            best = f"{label}, {filename}:{lineno}: {source}"
    if best is None:
        best = _line_from_message(str(exc))
    return best


def _package_dirs() -> tuple[str, ...]:
    """The folders of infopt's loaded modules: any frame of infopt's own code runs from one of them."""
    found = {str(Path(m.__file__).resolve().parent) + "/" for n, m in list(sys.modules.items())
             if (n == "infopt" or n.startswith("infopt.")) and getattr(m, "__file__", None)}
    return tuple(sorted(found))


def _chain(exc: BaseException):
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        exc = exc.__cause__ or exc.__context__


def _line_from_message(text: str) -> str | None:
    """torch often puts the user's frame in the message itself: 'File "x.py", line N'."""
    import re

    hits = re.findall(r'File "([^"]+)", line (\d+)', text)
    for filename, lineno in reversed(hits):
        if "/torch/" not in filename:
            return f"{filename}:{lineno}: {linecache.getline(filename, int(lineno)).strip()}"
    return None


def exported_outputs(program, spec: InputSpec, names: tuple[str, ...]) -> list[tuple[str, str, tuple]]:
    """(name, dtype, shape) of each user output of ``program``, its dynamic dims named by the spec's symbols."""
    from torch.export.graph_signature import InputKind

    signature = program.graph_signature
    # by position, not by name: a placeholder can be renamed after export (an input called ``input``,
    # a Python builtin, becomes ``input_1`` once torch regenerates the module's code)
    placeholders = [n for n in program.graph.nodes if n.op == "placeholder"]
    user = [node for node, input_spec in zip(placeholders, signature.input_specs) if input_spec.kind == InputKind.USER_INPUT]
    symbols: dict[str, str] = {}
    for tensor, node in zip(spec.inputs, user):
        for dim, size in zip(tensor.shape, node.meta["val"].shape):
            if isinstance(dim, str):
                symbols[str(size)] = dim
    output_node = next(n for n in program.graph.nodes if n.op == "output")
    values = list(output_node.args[0])[-len(signature.user_outputs):]
    found = []
    for i, value in enumerate(values):
        fake = value.meta["val"]
        shape = tuple(int(d) if str(d).isdigit() else symbols.get(str(d), f"d{j}") for j, d in enumerate(fake.shape))
        found.append((names[i] if i < len(names) else f"output_{i}", dtype_name(fake.dtype), shape))
    return found
