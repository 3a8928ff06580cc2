"""The output's copies of one file are hashed once, and a copy written after it was placed is hashed again."""

from __future__ import annotations

import hashlib
import os

from infopt.core import file_hash, manifest
from infopt.core.manifest import file_table


def _counting(monkeypatch) -> list:
    reads = []
    real = file_hash.sha256

    def counted(path):
        reads.append(os.path.basename(os.path.dirname(path)) + "/" + os.path.basename(path))
        return real(path)

    monkeypatch.setattr(manifest, "sha256", counted)  # what the file table hashes with
    return reads


def test_a_file_copied_and_moved_is_read_once_for_the_manifest(tmp_path, monkeypatch):
    (tmp_path / "work").mkdir()
    (tmp_path / "out" / "a").mkdir(parents=True)
    (tmp_path / "out" / "b").mkdir()
    source = tmp_path / "work" / "weights.data"
    source.write_bytes(os.urandom(1 << 16))
    file_hash.copy_file(source, tmp_path / "out" / "a" / "weights.data")
    file_hash.move_file(source, tmp_path / "out" / "b" / "weights.data")
    (tmp_path / "out" / "other.txt").write_text("x")
    reads = _counting(monkeypatch)
    table = file_table(tmp_path / "out")
    expected = hashlib.sha256((tmp_path / "out" / "a" / "weights.data").read_bytes()).hexdigest()
    assert table["a/weights.data"]["sha256"] == table["b/weights.data"]["sha256"] == expected
    assert sorted(reads) in (["a/weights.data", "out/other.txt"], ["b/weights.data", "out/other.txt"])


def test_a_copy_written_after_it_was_placed_is_hashed_again(tmp_path, monkeypatch):
    source = tmp_path / "out" / "weights.data"
    source.parent.mkdir()
    source.write_bytes(b"\0" * 4096)
    copy = file_hash.copy_file(source, tmp_path / "out" / "copy.data")
    assert file_hash.origin(copy) == file_hash.origin(source)
    with open(copy, "r+b") as handle:  # the same size, other bytes, a later modification time
        handle.write(b"\1")
    os.utime(copy, ns=(os.stat(copy).st_atime_ns, os.stat(source).st_mtime_ns + 10**9))
    reads = _counting(monkeypatch)
    table = file_table(tmp_path / "out")
    assert table["copy.data"]["sha256"] == hashlib.sha256(copy.read_bytes()).hexdigest() != table["weights.data"]["sha256"]
    assert sorted(reads) == ["out/copy.data", "out/weights.data"]
