"""RTN of a weight read from a file that nothing wrote to hands each block's pages back once it is rounded
(``quantize/rtn.rtn_quantize(read_only_file=True)``, the INT4 head's tied table): the same codes, and the table
never resident whole."""

from __future__ import annotations

import warnings

import numpy as np
import torch

from infopt.core.memory import resident_bytes
from infopt.quantize.rtn import rtn_quantize

ROWS, COLS = 16384, 1024  # 64 MB of float32


def _mapped(path) -> torch.Tensor:
    array = np.memmap(path, dtype=np.float32, mode="r", shape=(ROWS, COLS))
    with warnings.catch_warnings():  # torch warns that the array is not writable: nothing writes it
        warnings.simplefilter("ignore")
        return torch.from_numpy(array)


def _growth(path, read_only_file: bool):
    weight = _mapped(path)
    before = resident_bytes()
    packed = rtn_quantize(weight, 64, symmetric=False, read_only_file=read_only_file)
    grown = resident_bytes() - before - sum(t.numel() * t.element_size() for t in (packed.qweight, packed.scales, packed.zeros))
    del weight
    return packed, grown


def test_the_same_codes_and_the_mapped_pages_handed_back(tmp_path):
    path = tmp_path / "table.bin"
    np.random.default_rng(0).standard_normal((ROWS, COLS), dtype=np.float32).tofile(path)
    kept, kept_growth = _growth(path, read_only_file=False)
    handed, handed_growth = _growth(path, read_only_file=True)
    assert torch.equal(kept.qweight, handed.qweight) and torch.equal(kept.scales, handed.scales)
    assert torch.equal(kept.zeros, handed.zeros)
    size = ROWS * COLS * 4
    assert kept_growth - handed_growth > 0.75 * size, (kept_growth, handed_growth)  # the table's pages, not resident
