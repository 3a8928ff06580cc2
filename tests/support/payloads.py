"""Files an attacker would hand infopt: each one, if unpickled, writes a marker file.

``Payload`` pickles as a call to ``exec`` (a global the cheap opcode scan lets through, so torch's
safe unpickler is what must refuse it) and ``SystemPayload`` as ``posix.system``.
"""

from __future__ import annotations

import io
import json
import pickle
import zipfile
from pathlib import Path

import numpy as np
import torch


class Payload:
    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return exec, (f"open({self.marker!r}, 'w').write('ran')",)


class SystemPayload(Payload):
    def __reduce__(self):
        import os

        return os.system, (f"touch {self.marker}",)


class Tiny(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 3)
        self.register_buffer("shift", torch.ones(3))

    def forward(self, x):
        return self.fc(x) + self.shift


def _pt2(path: Path) -> Path:
    program = torch.export.export(Tiny().eval(), (torch.randn(2, 4),))
    torch.export.save(program, str(path))
    return path


def _rewrite(path: Path, change) -> Path:
    """Rewrite a zip archive entry by entry: ``change(name, data)`` returns new bytes, or None to keep."""
    with zipfile.ZipFile(path) as archive:
        entries = [(info.filename, archive.read(info)) for info in archive.infolist()]
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as archive:
        for name, data in entries:
            new = change(name, data)
            archive.writestr(name, data if new is None else new)
    return path


def _root(path: Path) -> str:
    with zipfile.ZipFile(path) as archive:
        return archive.namelist()[0].split("/")[0]


def torch_save_bytes(obj) -> bytes:
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return buffer.getvalue()


def pt2_use_pickle(path: Path, marker: Path) -> Path:
    """A weight marked ``use_pickle``, whose bytes are a pickle that runs code."""
    def change(name, data):
        if name.endswith("_weights_config.json"):
            config = json.loads(data)
            first = next(iter(config["config"].values()))
            first["use_pickle"] = True
            return json.dumps(config).encode()
        if name.endswith("data/weights/weight_0"):
            return pickle.dumps(Payload(marker))
        return None
    return _rewrite(_pt2(path), change)


def _with_entry(path: Path, entry: str, data: bytes) -> Path:
    """A saved .pt2 with one more entry under its root folder."""
    _pt2(path)
    root = _root(path)
    with zipfile.ZipFile(path, "a") as archive:
        archive.writestr(f"{root}/{entry}", data)
    return path


def pt2_legacy_weights(path: Path, marker: Path) -> Path:
    """A legacy ``data/weights/<model>.pt`` file, which torch reads instead of the configs."""
    return _with_entry(path, "data/weights/model.pt", torch_save_bytes({"fc.weight": Payload(marker)}))


def pt2_legacy_constants(path: Path, marker: Path) -> Path:
    return _with_entry(path, "data/constants/model.pt", torch_save_bytes({"shift": SystemPayload(marker)}))


def pt2_sample_inputs(path: Path, marker: Path) -> Path:
    """Sample inputs that fail the safe unpickler, which torch then retries with the full one."""
    return _rewrite(_pt2(path), lambda name, data: torch_save_bytes((Payload(marker),)) if "sample_inputs" in name else None)


def pt2_opaque_object(path: Path, marker: Path) -> Path:
    """A constant stored as an opaque object, which torch reads with ``pickle.loads``."""
    def change(name, data):
        if name.endswith("_constants_config.json"):
            config = json.loads(data)
            meta = {"dtype": 7, "sizes": [{"as_int": 1}], "requires_grad": False, "device": {"type": "cpu", "index": None},
                    "strides": [{"as_int": 1}], "storage_offset": {"as_int": 0}, "layout": 7}
            config["config"]["evil"] = {"path_name": "opaque_obj_0", "is_param": False, "use_pickle": False,
                                        "tensor_meta": meta}
            return json.dumps(config).encode()
        return None
    evil = pickle.dumps(Payload(marker))
    _with_entry(path, "data/constants/opaque_obj_0", evil + b"\0" * (-len(evil) % 4))  # whole float32s
    return _rewrite(path, change)


def pickled_module(path: Path, marker: Path) -> Path:
    torch.save(Payload(marker), path)
    return path


def state_dict_with_payload(path: Path, marker: Path) -> Path:
    torch.save({"fc.weight": torch.zeros(3, 4), "fc.bias": Payload(marker)}, path)
    return path


def legacy_format_payload(path: Path, marker: Path) -> Path:
    torch.save({"fc.weight": SystemPayload(marker)}, path, _use_new_zipfile_serialization=False)
    return path


def torchscript_lookalike(path: Path, marker: Path) -> Path:
    """A zip laid out as TorchScript whose pickles call code."""
    evil = pickle.dumps(Payload(marker), protocol=2)
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("m/code/__torch__.py", "def forward(self, x):\n  return x\n")
        archive.writestr("m/data.pkl", evil)
        archive.writestr("m/constants.pkl", evil)
        archive.writestr("m/version", "3\n")
    return path


def samples_pt(path: Path, marker: Path, name: str = "x") -> Path:
    torch.save({name: torch.zeros(2, 4), "extra": Payload(marker)}, path)
    return path


def object_npy(path: Path, marker: Path) -> Path:
    np.save(path, np.array([Payload(marker)], dtype=object), allow_pickle=True)
    return path


def object_npz(path: Path, marker: Path, name: str = "x") -> Path:
    np.savez(path, **{name: np.array([Payload(marker)], dtype=object)})
    return path


def yaml_python_tag(path: Path, marker: Path) -> Path:
    path.write_text(f"name: evil\nprecision: !!python/object/apply:os.system [\"touch {marker}\"]\n")
    return path
