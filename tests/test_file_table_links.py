"""The manifest's file table hashes a file once, whatever names it has in the folder (hard links): the table lists
each name with the file's size and sha256."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from infopt.core.manifest import file_table


def test_the_file_table_hashes_linked_files_once_and_lists_each_name(tmp_path, monkeypatch):
    import infopt.core.manifest as manifest

    (tmp_path / "model").mkdir()
    (tmp_path / "servers").mkdir()
    (tmp_path / "model" / "weights.bin").write_bytes(b"w" * 5000)
    os.link(tmp_path / "model" / "weights.bin", tmp_path / "servers" / "weights.bin")
    (tmp_path / "servers" / "copy.bin").write_bytes(b"w" * 5000)
    hashed = []
    real = manifest.sha256
    monkeypatch.setattr(manifest, "sha256", lambda path: hashed.append(Path(path).name) or real(path))
    table = file_table(tmp_path)
    assert sorted(hashed) == ["copy.bin", "weights.bin"]  # the two names of one file hashed once
    digest = hashlib.sha256(b"w" * 5000).hexdigest()
    assert set(table) == {"model/weights.bin", "servers/weights.bin", "servers/copy.bin"}
    assert all(row == {"bytes": 5000, "sha256": digest} for row in table.values())
