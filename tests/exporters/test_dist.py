from __future__ import annotations

import json

from infopt.core.manifest import file_table, read_manifest, verify_files, write_manifest
from infopt.core.manifest_schema import jsonable
from tests.support.manifests import typed_manifest


def test_manifest_hashes_detect_tampering(tmp_path):
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "w.bin").write_bytes(b"1234")
    manifest = typed_manifest(artifacts={"model": "model/w.bin"}, files=file_table(tmp_path),
                              validation={"drift": {"worst": {"sqnr_db": float("inf")}}})
    write_manifest(tmp_path, manifest)
    assert json.loads((tmp_path / "manifest.json").read_text())["validation"]["drift"]["worst"]["sqnr_db"] == "inf"
    assert read_manifest(tmp_path) == manifest.model_copy(update={"validation": manifest.validation.model_copy(
        update={"drift": {"worst": {"sqnr_db": "inf"}}})})
    assert verify_files(tmp_path, manifest.files) == []
    (tmp_path / "model" / "w.bin").write_bytes(b"1235")
    assert verify_files(tmp_path, manifest.files) == ["model/w.bin: sha256 differs from the manifest"]
    assert jsonable([float("nan")]) == ["nan"]
