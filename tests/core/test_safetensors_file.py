"""infopt's safetensors writer, read back by the safetensors library itself."""

from __future__ import annotations

import pytest
import torch
from safetensors import safe_open

from infopt.core.safetensors_file import write_safetensors


def test_every_dtype_shape_and_the_metadata_read_back_as_written(tmp_path):
    tensors = {"bf16": torch.randn(3, 5).to(torch.bfloat16), "f32": torch.randn(7), "scalar": torch.tensor(2.5),
               "empty": torch.empty(0, 4), "i32": torch.arange(12, dtype=torch.int32).reshape(3, 4),
               "u8": torch.arange(9, dtype=torch.uint8), "flag": torch.tensor([True, False]),
               "strided": torch.randn(4, 6)[:, ::2]}
    size = write_safetensors(tmp_path / "a.safetensors", tensors, {"format": "pt"})
    assert size == (tmp_path / "a.safetensors").stat().st_size
    with safe_open(str(tmp_path / "a.safetensors"), "pt") as f:
        assert f.metadata() == {"format": "pt"} and set(f.keys()) == set(tensors)
        for name, want in tensors.items():
            got = f.get_tensor(name)
            assert got.dtype == want.dtype and torch.equal(got, want), name


def test_floats_are_cast_and_the_rest_kept(tmp_path):
    tensors = {"w": torch.randn(4, 4, dtype=torch.bfloat16), "ids": torch.arange(4)}
    write_safetensors(tmp_path / "b.safetensors", tensors, floats=torch.float16)
    with safe_open(str(tmp_path / "b.safetensors"), "pt") as f:
        assert torch.equal(f.get_tensor("w"), tensors["w"].half()) and f.get_tensor("ids").dtype == torch.int64


def test_a_dtype_safetensors_cannot_hold_is_refused_before_anything_is_written(tmp_path):
    with pytest.raises(ValueError, match="complex"):
        write_safetensors(tmp_path / "c.safetensors", {"z": torch.zeros(2, dtype=torch.complex64)})
    assert not (tmp_path / "c.safetensors").exists()


def test_deferred_tensors_are_made_in_turn_and_blocks_cast_across_their_boundaries(tmp_path, monkeypatch):
    import infopt.core.safetensors_file as module

    monkeypatch.setattr(module, "BLOCK_ELEMENTS", 5)  # 13 elements: blocks of 5, 5 and 3
    made = []
    big = torch.randn(13, dtype=torch.float32)

    def make(name, value):
        def run():
            made.append(name)
            return value
        return run

    tensors = {"first": module.Deferred((2, 3), torch.int32, make("first", torch.arange(6, dtype=torch.int32).reshape(2, 3))),
               "big": big, "last": module.Deferred((4,), torch.float32, make("last", torch.ones(4)))}
    write_safetensors(tmp_path / "d.safetensors", tensors, floats=torch.float16)
    assert made == ["first", "last"]
    with safe_open(str(tmp_path / "d.safetensors"), "pt") as f:
        assert torch.equal(f.get_tensor("first"), torch.arange(6, dtype=torch.int32).reshape(2, 3))
        assert torch.equal(f.get_tensor("big"), big.half()) and torch.equal(f.get_tensor("last"), torch.ones(4).half())


def test_a_deferred_tensor_made_other_than_declared_is_an_error(tmp_path):
    from infopt.core.safetensors_file import Deferred

    with pytest.raises(ValueError, match="declared torch.int32 \\[3\\] and made torch.int32 \\[4\\]"):
        write_safetensors(tmp_path / "e.safetensors", {"x": Deferred((3,), torch.int32, lambda: torch.zeros(4, dtype=torch.int32))})
