"""Calibration data: every source form, seeded sampling, padding, and errors that name the sample."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from infopt.core.errors import InputSpecError, UsageError
from infopt.core.inputspec import DimRange, InputSpec
from infopt.quantize.calib_data import load_calibration

IMG = InputSpec.parse(["x:float32[batch,1,8,8]"])
TOKENS = InputSpec.parse(["ids:int64[batch,seq]", "mask:int64[batch,seq]"]).with_dims({"seq": DimRange(1, 8, 32)})


def images(n, seed=0):
    return np.random.default_rng(seed).random((n, 1, 8, 8), dtype=np.float32)


def test_folder_of_npy_npz_and_pt_files(tmp_path):
    np.save(tmp_path / "a.npy", images(3))
    np.savez(tmp_path / "b.npz", x=images(2, 1))
    torch.save(torch.from_numpy(images(4, 2)), tmp_path / "c.pt")
    data = load_calibration(tmp_path, IMG, samples=None, batch_size=4)
    assert data.count == 9
    assert [b["x"].shape[0] for b in data.batches] == [4, 4, 1]
    stacked = np.concatenate([b["x"] for b in data.batches])
    assert np.array_equal(stacked[:3], images(3)) and np.array_equal(stacked[5:], images(4, 2))


def test_sampling_is_seeded_and_digest_follows_content(tmp_path):
    np.savez(tmp_path / "d.npz", x=images(100))
    a = load_calibration(tmp_path / "d.npz", IMG, samples=10, seed=0)
    b = load_calibration(tmp_path / "d.npz", IMG, samples=10, seed=0)
    c = load_calibration(tmp_path / "d.npz", IMG, samples=10, seed=1)
    assert a.count == 10 and a.digest == b.digest
    assert np.array_equal(a.batches[0]["x"], b.batches[0]["x"])
    assert c.digest != a.digest


def test_iterable_dataloader_and_module_function(tmp_path, monkeypatch):
    x = torch.from_numpy(images(12))
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, torch.zeros(12)), batch_size=5)
    from_loader = load_calibration(loader, IMG, samples=None)
    assert from_loader.count == 12  # (inputs, labels) pairs: labels dropped
    from_list = load_calibration([{"x": images(2)}, images(3, 1)], IMG, samples=None)
    assert from_list.count == 5
    (tmp_path / "calib_source.py").write_text(
        "import numpy as np\n"
        "def batches():\n"
        "    return [np.ones((2, 1, 8, 8), np.float32) * i for i in range(3)]\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    from_function = load_calibration("calib_source:batches", IMG, samples=None)
    assert from_function.count == 6
    assert from_function.batches[0]["x"].max() == 2.0


def test_variable_length_inputs_are_zero_padded_to_the_spec():
    short = {"ids": np.array([[5, 6, 7]]), "mask": np.array([[1, 1, 1]])}
    long = {"ids": np.arange(1, 13)[None], "mask": np.ones((1, 12), np.int64)}
    data = load_calibration([short, long], TOKENS, samples=None)
    ids = data.batches[0]["ids"]
    assert ids.shape == (2, 12)  # longer than opt (8): the longest sample sets the length
    assert list(ids[0]) == [5, 6, 7] + [0] * 9 and list(data.batches[0]["mask"][0][3:]) == [0] * 9
    only_short = load_calibration([short], TOKENS, samples=None)
    assert only_short.batches[0]["ids"].shape == (1, 8)  # padded up to opt


@pytest.mark.parametrize("bad, message", [
    (np.zeros((2, 1, 8, 8), np.float64), "is float64, the model takes float32"),
    (np.zeros((2, 1, 7, 8), np.float32), "size 7 on axis 2"),
    (np.full((2, 1, 8, 8), np.nan, np.float32), "NaN or Inf"),
])
def test_bad_samples_are_named(tmp_path, bad, message):
    np.savez(tmp_path / "good.npz", x=images(2))
    np.savez(tmp_path / "bad.npz", x=bad)
    with pytest.raises(InputSpecError) as err:
        load_calibration(tmp_path, IMG)
    assert message in str(err.value) and "bad.npz" in str(err.value)
    assert err.value.exit_code == 2


def test_empty_sources_and_bad_counts(tmp_path):
    with pytest.raises(UsageError, match="holds no samples"):
        load_calibration([], IMG)
    with pytest.raises(UsageError, match="at least 1"):
        load_calibration([images(1)], IMG, samples=0)
    with pytest.raises(UsageError, match="not found"):
        load_calibration(tmp_path / "missing", IMG)
    with pytest.raises(UsageError, match="cannot import the calibration function"):
        load_calibration("no_such_module_x:batches", IMG)


def test_text_file_with_a_tokenizer(tmp_path):
    pytest.importorskip("transformers")
    minilm = pytest.importorskip("examples.minilm")
    spec = InputSpec.parse(["input_ids:int64[batch,seq]", "attention_mask:int64[batch,seq]"]).with_dims(
        {"seq": DimRange(1, 16, 64)})
    text = tmp_path / "calib.txt"
    text.write_text("A short line.\n\nA much longer line that has quite a few more words in it than the first.\n")
    data = load_calibration(text, spec, samples=None, tokenizer=str(minilm.model_dir()))
    assert data.count == 2  # the empty line is skipped
    ids, mask = data.batches[0]["input_ids"], data.batches[0]["attention_mask"]
    assert ids.shape == (2, 16) and ids[0, 0] == 101  # [CLS], padded to the seq dim's opt
    assert mask[0].sum() < mask[1].sum() == 16  # the long line is truncated to 16 tokens
    with pytest.raises(UsageError, match="needs the model's tokenizer"):
        load_calibration(text, spec)
