"""A checkpoint's mapped pages handed back once a layer is quantized (``core/memory.drop_file_pages``): the
resident memory goes down, what the tensor reads stays the file's, and memory that is not a file's is left alone."""

from __future__ import annotations

import numpy as np
import torch

from infopt.core.memory import drop_file_pages, file_mapping, resident_bytes

MB = 2**20


def mapped(tmp_path, megabytes: int = 64) -> tuple[torch.Tensor, np.ndarray]:
    """A float32 tensor that is a private mapping of a file (as transformers maps a safetensors checkpoint)."""
    values = np.random.default_rng(0).standard_normal(megabytes * MB // 4).astype(np.float32)
    values.tofile(tmp_path / "weights.bin")
    view = np.memmap(tmp_path / "weights.bin", dtype=np.float32, mode="c")  # copy-on-write: MAP_PRIVATE
    return torch.from_numpy(view), values


def test_a_mapped_tensors_pages_go_back_and_it_still_reads_the_files_values(tmp_path):
    tensor, values = mapped(tmp_path)
    assert file_mapping(tensor.data_ptr())[2] == str(tmp_path / "weights.bin")
    assert float(tensor.sum()) != 0.0  # every page touched: resident
    before = resident_bytes()
    handed = drop_file_pages(tensor)
    after = resident_bytes()
    assert handed >= 63 * MB and before - after >= 48 * MB  # most of the 64 MB left the process's resident set
    np.testing.assert_array_equal(tensor.numpy(), values)  # read again from the file: the same values


def test_memory_that_is_not_a_files_is_left_alone():
    heap = torch.randn(16 * MB // 4)
    copy = heap.clone()
    assert file_mapping(heap.data_ptr()) is None and drop_file_pages(heap) == 0
    assert torch.equal(heap, copy)
