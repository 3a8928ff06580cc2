from __future__ import annotations

import json

from infopt.core.manifest import file_table, jsonable, verify_files, write_manifest


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
