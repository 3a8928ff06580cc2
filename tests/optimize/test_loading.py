from __future__ import annotations

import pickle
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch

from infopt.core.errors import ModelLoadError, UnsafePickleError, UsageError
from infopt.core.safe_load import pickled_classes
from infopt.runtime.loading import load_model, sniff


class Booby(torch.nn.Module):
    """Unpickling this writes a marker file: proof of whether the file was unpickled."""

    marker: Path = Path("/nonexistent")

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(2, 2)

    def __setstate__(self, state):
        Path(state["_marker"]).write_text("unpickled")
        super().__setstate__(state)


def make_booby(path: Path, marker: Path) -> None:
    module = Booby()
    module.__dict__["_marker"] = str(marker)
    torch.save(module, path)


def test_formats_are_sniffed(files):
    assert sniff(files / "cnn_ts.pt") == "torchscript"
    assert sniff(files / "encoder.pt2") == "pt2"
    assert sniff(files / "cnn_sd.pt") == "torch-save"


def test_torchscript_loads(files, digits):
    loaded = load_model(files / "cnn_ts.pt")
    x = torch.from_numpy(digits[1]["val"][0][:4])
    assert torch.allclose(loaded.module(x), digits[0](x))
    assert loaded.arg_names == ("x",)


def test_pt2_loads_with_spec(files):
    loaded = load_model(files / "encoder.pt2")
    assert loaded.spec.inputs[0].shape == ("batch", "d1")
    assert loaded.spec.dims["d1"].min == 2 and loaded.spec.dims["d1"].max == 64
    assert loaded.spec.inputs[0].dtype == "int64"
    assert loaded.spec.dims["batch"].max == 64


def test_state_dict_needs_model_class(files):
    with pytest.raises(UsageError, match="--model-class"):
        load_model(files / "cnn_sd.pt")
    loaded = load_model(files / "cnn_sd.pt", model_class="examples.models:DigitsCNN")
    assert loaded.format == "state_dict"
    assert isinstance(loaded.module, torch.nn.Module) and not loaded.module.training


def test_state_dict_mismatch_is_clear(files):
    with pytest.raises(UsageError, match="does not fit"):
        load_model(files / "cnn_sd.pt", model_class="examples.models:DigitsCNN", model_args='{"channels": 8}')


def test_bad_model_class(files):
    with pytest.raises(UsageError, match="pkg.module:Class"):
        load_model(files / "cnn_sd.pt", model_class="examples.models.DigitsCNN")
    with pytest.raises(UsageError, match="cannot import"):
        load_model(files / "cnn_sd.pt", model_class="examples.models:Nope")
    with pytest.raises(UsageError, match="JSON"):
        load_model(files / "cnn_sd.pt", model_class="examples.models:DigitsCNN", model_args="{bad")


def test_pickled_module_refused_and_never_unpickled(tmp_path):
    marker = tmp_path / "marker.txt"
    path = tmp_path / "booby.pt"
    make_booby(path, marker)
    assert "tests.optimize.test_loading.Booby" in pickled_classes(path)
    with pytest.raises(UnsafePickleError) as err:
        load_model(path)
    assert "--allow-pickle" in str(err.value) and "Booby" in str(err.value)
    assert not marker.exists()


def test_pickled_module_loads_with_consent(tmp_path):
    marker = tmp_path / "marker.txt"
    path = tmp_path / "booby.pt"
    make_booby(path, marker)
    loaded = load_model(path, allow_pickle=True)
    assert marker.read_text() == "unpickled"
    assert loaded.format == "pickle"


def test_plain_pickle_file_refused(tmp_path):
    path = tmp_path / "legacy.pt"
    with open(path, "wb") as handle:
        pickle.dump({"a": object()}, handle, protocol=2)
    with pytest.raises((UnsafePickleError, ModelLoadError)):
        load_model(path)


def test_missing_empty_truncated_unknown(tmp_path, files):
    with pytest.raises(ModelLoadError, match="not found"):
        load_model(tmp_path / "nope.pt")
    (tmp_path / "empty.pt").write_bytes(b"")
    with pytest.raises(ModelLoadError, match="empty"):
        load_model(tmp_path / "empty.pt")
    data = (files / "cnn_ts.pt").read_bytes()
    (tmp_path / "cut.pt").write_bytes(data[: len(data) // 2])
    with pytest.raises(ModelLoadError, match="corrupt or truncated"):
        load_model(tmp_path / "cut.pt")
    (tmp_path / "notes.pt").write_text("hello, not a model")
    with pytest.raises(ModelLoadError, match="not a model file"):
        load_model(tmp_path / "notes.pt")
    with zipfile.ZipFile(tmp_path / "other.pt", "w") as archive:
        archive.writestr("readme.txt", "zip but not torch")
    with pytest.raises(ModelLoadError, match="zip archive"):
        load_model(tmp_path / "other.pt")


def test_corrupt_onnx(tmp_path):
    path = tmp_path / "bad.onnx"
    path.write_bytes(b"\x08\x07garbage" + np.random.default_rng(0).bytes(64))
    with pytest.raises(ModelLoadError, match="ONNX"):
        load_model(path)
