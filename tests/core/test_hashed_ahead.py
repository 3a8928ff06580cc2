"""Files hashed in child processes while a build judges its folder, for the manifest's file table."""

from __future__ import annotations

import os

import pytest

from infopt.core import file_hash
from infopt.core.file_hash import hashed_ahead, known_sha256, sha256, signature
from infopt.core.manifest import file_table


def test_a_file_hashed_ahead_gives_the_manifest_its_digest_without_reading_it_again(tmp_path, monkeypatch):
    data = tmp_path / "model.onnx.data"
    data.write_bytes(os.urandom(3 << 20))
    with hashed_ahead([data]):
        pass
    assert known_sha256(signature(data)) == sha256(data)
    read = []
    monkeypatch.setattr("infopt.core.manifest.sha256", lambda path: read.append(path) or sha256(path))
    assert file_table(tmp_path)["model.onnx.data"]["sha256"] == sha256(data) and read == []


def test_a_file_changed_while_it_was_hashed_is_hashed_again_by_the_manifest(tmp_path):
    data = tmp_path / "model.onnx.data"
    data.write_bytes(b"a" * (1 << 20))
    before = signature(data)
    with hashed_ahead([data]):
        data.write_bytes(b"b" * (1 << 20))
        os.utime(data, ns=(before[3] + 10**9, before[3] + 10**9))  # a later mtime, as any write on a coarse clock
    assert known_sha256(before) is None and known_sha256(signature(data)) is None
    assert file_table(tmp_path)["model.onnx.data"]["sha256"] == sha256(data)


def test_an_error_in_the_block_stops_the_hashing_and_keeps_nothing(tmp_path, monkeypatch):
    data = tmp_path / "model.onnx.data"
    data.write_bytes(os.urandom(1 << 20))
    started = []
    real = file_hash.subprocess.Popen
    monkeypatch.setattr(file_hash.subprocess, "Popen", lambda *a, **k: started.append(real(*a, **k)) or started[-1])
    with pytest.raises(KeyboardInterrupt), hashed_ahead([data]):
        raise KeyboardInterrupt
    assert started and all(child.returncode is not None for child in started)
    assert known_sha256(signature(data)) is None
