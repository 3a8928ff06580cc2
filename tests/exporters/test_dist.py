from __future__ import annotations

import json

import pytest

from infopt.errors import OutputExistsError, UsageError
from infopt.exporters.dist import file_table, jsonable, staged_output, verify_files, write_manifest


def test_staged_output_renames_into_place(tmp_path):
    out = tmp_path / "dist" / "m"
    with staged_output(out, force=False) as stage:
        (stage / "a.txt").write_text("a")
        assert not out.exists()
    assert (out / "a.txt").read_text() == "a"
    assert [p.name for p in out.parent.iterdir()] == ["m"]


def test_failure_leaves_nothing(tmp_path):
    out = tmp_path / "m"
    with pytest.raises(RuntimeError):
        with staged_output(out, force=False) as stage:
            (stage / "half.txt").write_text("half")
            raise RuntimeError("boom")
    assert list(tmp_path.iterdir()) == []


def test_existing_needs_force(tmp_path):
    out = tmp_path / "m"
    out.mkdir()
    (out / "old.txt").write_text("old")
    with pytest.raises(OutputExistsError, match="--force"):
        with staged_output(out, force=False):
            pass
    assert (out / "old.txt").exists()
    with staged_output(out, force=True) as stage:
        (stage / "new.txt").write_text("new")
    assert sorted(p.name for p in out.iterdir()) == ["new.txt"]
    assert [p.name for p in tmp_path.iterdir()] == ["m"]


def test_unwritable_parent(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(UsageError, match="cannot write"):
        with staged_output(blocker / "m", force=False):
            pass


def test_manifest_hashes_detect_tampering(tmp_path):
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "w.bin").write_bytes(b"1234")
    manifest = {"files": file_table(tmp_path), "score": float("inf")}
    write_manifest(tmp_path, manifest)
    assert json.loads((tmp_path / "manifest.json").read_text())["score"] == "inf"
    assert verify_files(tmp_path, manifest) == []
    (tmp_path / "model" / "w.bin").write_bytes(b"1235")
    assert verify_files(tmp_path, manifest) == ["model/w.bin: sha256 differs from the manifest"]
    assert jsonable([float("nan")]) == ["nan"]
