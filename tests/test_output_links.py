"""A file the build wrote reaches the output as a hard link (``core/work_folders.place_file``): written once, hashed
once; a user's own file is always copied, and nothing writes through a link into the file it shares."""

from __future__ import annotations

import hashlib
from pathlib import Path

from infopt.core.manifest import file_table
from infopt.core.work_folders import in_work_folder, link_or_copy, place_file, work_folder


def test_a_file_from_a_work_folder_is_linked_and_a_users_file_is_copied(tmp_path):
    users = tmp_path / "model.onnx.data"
    users.write_bytes(b"the user's weights")
    place_file(users, tmp_path / "copied")
    assert not in_work_folder(users)
    assert (tmp_path / "copied").stat().st_ino != users.stat().st_ino
    assert (tmp_path / "copied").read_bytes() == users.read_bytes()

    with work_folder("build") as work:
        built = Path(work) / "weights.data"
        built.write_bytes(b"built weights")
        assert in_work_folder(built) and in_work_folder(Path(work) / "sub" / "x")
        place_file(built, tmp_path / "linked")
        assert (tmp_path / "linked").stat().st_ino == built.stat().st_ino
    # the work folder gone, the output's link keeps the bytes
    assert (tmp_path / "linked").read_bytes() == b"built weights"


def test_linking_over_an_existing_file_replaces_it_without_writing_into_what_it_shared(tmp_path):
    a, b, c = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    a.write_bytes(b"A")
    c.write_bytes(b"C")
    link_or_copy(a, b)
    link_or_copy(c, b)  # b was a's link: a keeps its bytes
    assert a.read_bytes() == b"A" and b.read_bytes() == b"C" and b.stat().st_ino == c.stat().st_ino


def test_the_file_table_hashes_linked_files_once_and_lists_each_name(tmp_path, monkeypatch):
    import infopt.core.manifest as manifest

    (tmp_path / "model").mkdir()
    (tmp_path / "servers").mkdir()
    (tmp_path / "model" / "model.onnx.data").write_bytes(b"w" * 5000)
    link_or_copy(tmp_path / "model" / "model.onnx.data", tmp_path / "servers" / "model.onnx.data")
    (tmp_path / "servers" / "copy.data").write_bytes(b"w" * 5000)
    hashed = []
    real = manifest.sha256
    monkeypatch.setattr(manifest, "sha256", lambda path: hashed.append(Path(path).name) or real(path))
    table = file_table(tmp_path)
    assert sorted(hashed) == ["copy.data", "model.onnx.data"]  # the two links hashed once
    digest = hashlib.sha256(b"w" * 5000).hexdigest()
    assert set(table) == {"model/model.onnx.data", "servers/model.onnx.data", "servers/copy.data"}
    assert all(row == {"bytes": 5000, "sha256": digest} for row in table.values())
