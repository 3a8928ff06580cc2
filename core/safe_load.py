"""The one way infopt reads a user's file that may hold a pickle: never unpickling code without consent.

A pickle names functions to call while it is read, so a model or data file can run code on the
machine that opens it. Every reader of user files goes through here:

- ``torch_file``: a ``torch.save`` file (state dict, ``--val``/``--calib`` tensors) with
  ``weights_only=True``, torch's unpickler that builds tensors and containers and nothing else;
- ``arrays_file``: ``.npy``/``.npz`` with ``allow_pickle=False`` (object arrays are pickles);
  data files take no ``--allow-pickle``: samples are tensors, and a pickle of them is refused;
- ``exported_program``: a ``torch.export`` ``.pt2`` archive. torch reads an entry marked
  ``use_pickle``, a legacy weights file, an opaque object or sample inputs that fail the safe
  unpickler with a full unpickler, so the archive is checked first and those are refused, and
  ``torch.load`` is held to ``weights_only=True`` while torch reads it.

``allow_pickle=True`` (``--allow-pickle``) is the user's consent to run what the file names.
"""

from __future__ import annotations

import json
import pickletools
import zipfile
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from infopt.core.errors import ModelLoadError, UnsafePickleError

SAFE_GLOBAL_PREFIXES = ("torch.", "collections.OrderedDict", "builtins.", "__builtin__.", "_codecs.encode")
"""Globals a plain tensor/state-dict pickle references; ``torch.nn.*`` and everything else name
module classes, which only a pickled object holds (the safe unpickler still decides)."""

_TRUST = "if you trust the file, pass --allow-pickle"


def refuse(path: Path | str, what: str, classes: list[str] | None = None, fix: str | None = None) -> UnsafePickleError:
    named = f" (it pickles {', '.join(classes[:4])})" if classes else ""
    return UnsafePickleError(f"{path} {what}{named}; unpickling it would run code named by the file",
                             fix=fix or f"{_TRUST}; better, save tensors only (torch.save of a dict of tensors, numpy.savez)")


def torch_file(path: Path, *, allow_pickle: bool = False, what: str = "holds pickled Python objects", fix: str | None = None) -> Any:
    """A ``torch.save`` file's contents; a pickle of anything but tensors and containers is refused."""
    import torch

    if allow_pickle:
        return torch.load(str(path), map_location="cpu", weights_only=False)
    classes = pickled_classes(path) if zipfile.is_zipfile(path) else []
    if classes:
        raise refuse(path, what, classes, fix)
    try:
        return torch.load(str(path), map_location="cpu", weights_only=True)
    except Exception as exc:
        if _refused_by_torch(exc):
            raise refuse(path, what, None, fix) from None
        raise


def arrays_file(path: Path):
    """``numpy.load`` without pickles: an array for .npy, a dict of arrays for .npz (read at once, so
    an object array is refused here rather than where it is first used)."""
    import numpy as np

    try:
        loaded = np.load(path, allow_pickle=False)
        if not isinstance(loaded, np.ndarray):
            with loaded:
                return {key: loaded[key] for key in loaded.files}
        return loaded
    except ValueError as exc:
        if "allow_pickle" in str(exc):
            raise refuse(path, "holds object arrays (Python objects pickled inside numpy)",
                         fix="save numeric arrays only (numpy.save/savez of float or int arrays)") from None
        raise


def _refused_by_torch(exc: Exception) -> bool:
    text = str(exc)
    return "weights_only" in text or "Unsupported global" in text or "Unsupported operand" in text


def pickled_classes(path: Path) -> list[str]:
    """The globals a torch.save archive's pickle references beyond plain tensors, found by
    reading its opcodes (nothing is executed)."""
    with zipfile.ZipFile(path) as archive:
        name = next((n for n in archive.namelist() if n.endswith("data.pkl")), None)
        if name is None:
            return []
        data = archive.read(name)
    return [ref for ref in dict.fromkeys(_globals(data, path))
            if ref.startswith("torch.nn.") or not ref.startswith(SAFE_GLOBAL_PREFIXES)]


def _globals(data: bytes, path: Path) -> list[str]:
    found: list[str] = []
    strings: list[Any] = []
    memo: dict[int, Any] = {}
    try:
        for op, arg, _ in pickletools.genops(data):
            if op.name == "GLOBAL":
                found.append(arg.replace(" ", "."))
            elif op.name in ("SHORT_BINUNICODE", "BINUNICODE", "UNICODE", "BINUNICODE8"):
                strings.append(arg)
            elif op.name == "MEMOIZE":
                memo[len(memo)] = strings[-1] if strings else None
            elif op.name in ("BINPUT", "LONG_BINPUT", "PUT"):
                memo[arg] = strings[-1] if strings else None
            elif op.name in ("BINGET", "LONG_BINGET", "GET"):
                strings.append(memo.get(arg))
            elif op.name == "STACK_GLOBAL" and len(strings) >= 2:
                found.append(f"{strings[-2]}.{strings[-1]}")
    except Exception as exc:  # noqa: BLE001 - a broken pickle stream
        raise ModelLoadError(f"{path} is corrupt or truncated: its pickle stream is broken ({exc})",
                             fix="re-save or re-download the file") from exc
    return found


_PT2_FIX = (f"{_TRUST}; better, export with plain tensors only (torch.export.save of a program whose weights are "
            "ordinary tensors) or save a TorchScript or state_dict instead")


def pickled_pt2_entries(path: Path) -> list[str]:
    """Entries of a ``.pt2`` archive that torch would read with a full unpickler (or as native code)."""
    found = []
    with zipfile.ZipFile(path) as archive:
        names = archive.namelist()
        for name in names:
            parts = name.split("/")
            if "aotinductor" in parts:
                found.append(f"{name} (compiled native code)")
            elif len(parts) >= 4 and parts[-3] == "data" and parts[-2] in ("weights", "constants") and name.endswith(".pt"):
                found.append(f"{name} (a legacy pickled {parts[-2]} file)")
            elif name.endswith(("_weights_config.json", "_constants_config.json")):
                for fqn, meta in _payload_config(archive, name).items():
                    entry = str(meta.get("path_name", ""))
                    if meta.get("use_pickle") or entry.startswith(("custom_obj", "opaque_obj")):
                        found.append(f"{name.rsplit('/', 1)[0]}/{entry} ({fqn}, pickled)")
    return list(dict.fromkeys(found))


def _payload_config(archive: zipfile.ZipFile, name: str) -> dict[str, Any]:
    try:
        config = json.loads(archive.read(name)).get("config", {})
    except (ValueError, AttributeError):
        return {}
    return {k: v for k, v in config.items() if isinstance(v, dict)} if isinstance(config, dict) else {}


def exported_program(path: Path, *, allow_pickle: bool = False):
    """``torch.export.load`` of a ``.pt2`` archive that unpickles nothing (unless ``allow_pickle``)."""
    import torch

    if allow_pickle:
        return torch.export.load(str(path))
    entries = pickled_pt2_entries(path)
    if entries:
        raise refuse(path, f"holds entries torch reads with a full unpickler: {', '.join(entries[:3])}", fix=_PT2_FIX)
    with _weights_only_torch_load():
        try:
            return torch.export.load(str(path))
        except Exception as exc:
            if _refused_by_torch(exc):
                raise refuse(path, "holds sample inputs or constants that are pickled Python objects", fix=_PT2_FIX) from None
            raise


@contextmanager
def _weights_only_torch_load() -> Iterator[None]:
    """While torch reads an archive, every ``torch.load`` it makes uses the safe unpickler."""
    import torch

    real = torch.load

    def load(*args, **kwargs):
        kwargs["weights_only"] = True
        return real(*args, **kwargs)

    torch.load = load
    try:
        yield
    finally:
        torch.load = real
