"""A built folder is sealed: every consumer (``infopt.load``, ``validate``, ``gate``, ``verify``)
refuses one whose files differ from the manifest or whose manifest points outside the folder, and
with a key, one whose manifest was edited after it was signed."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

import infopt
from infopt.api import validate
from infopt.core.errors import IntegrityError, UsageError
from infopt.core.manifest import sha256
from tests.support.cli import run_cli_here


@pytest.fixture(scope="module")
def built(digits_dist):
    return digits_dist


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ed25519

    folder = tmp_path_factory.mktemp("keys")
    for name in ("ours", "theirs"):
        private = ed25519.Ed25519PrivateKey.generate()
        (folder / f"{name}.pem").write_bytes(private.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
        (folder / f"{name}.pub.pem").write_bytes(private.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    return folder


def _copy(built: Path, tmp_path: Path) -> Path:
    dist = tmp_path / "digits"
    shutil.copytree(built, dist)
    return dist


def _manifest(dist: Path) -> dict:
    return json.loads((dist / "manifest.json").read_text())


def _save(dist: Path, manifest: dict) -> None:
    (dist / "manifest.json").write_text(json.dumps(manifest, indent=2))


def _append(path: Path) -> None:
    path.write_bytes(path.read_bytes() + b"\n")


def _triton_config(dist: Path) -> Path:
    return next(dist.glob("servers/triton/**/config.pbtxt"))


TAMPERING = {
    "model": lambda d: _append(d / _manifest(d)["artifacts"]["model"]),
    "report": lambda d: (d / "report.md").write_text("all good\n"),
    "triton config": lambda d: _append(_triton_config(d)),
    "samples": lambda d: np.savez(d / "validation" / "samples.npz", x=np.zeros(1)),
    "added file": lambda d: (d / "model" / "extra.onnx").write_bytes(b"\x08\x01"),
    "removed file": lambda d: (d / "report.html").unlink(),
}


def _consumers(dist: Path):
    """Each consumer's refusal as (exit code or exception, message)."""
    found = {}
    with pytest.raises(IntegrityError) as load_error:
        infopt.load(dist)
    found["load"] = str(load_error.value)
    result = validate(dist, progress=False)
    assert result["verdict"]["passed"] is False
    found["validate"] = "; ".join(result["verdict"]["reasons"])
    with pytest.raises(IntegrityError) as gate_error:
        infopt.gate(dist, dist, memory=False)
    found["gate"] = str(gate_error.value)
    return found


@pytest.mark.parametrize("change", sorted(TAMPERING))
def test_every_consumer_refuses_a_tampered_file(built, tmp_path, change):
    dist = _copy(built, tmp_path)
    TAMPERING[change](dist)
    for consumer, message in _consumers(dist).items():
        assert any(word in message for word in ("sha256 differs", "not in the manifest", "missing")), (consumer, message)
    proc = run_cli_here("verify", str(dist), cwd=tmp_path)
    assert proc.returncode == 1 and "MISMATCH" in proc.stdout


@pytest.mark.parametrize("escape", ["../outside.onnx", "/etc/hostname", "model/../../outside.onnx", "link.onnx"])
def test_a_manifest_path_outside_the_folder_is_refused(built, tmp_path, escape):
    dist = _copy(built, tmp_path)
    (tmp_path / "outside.onnx").write_bytes((dist / _manifest(dist)["artifacts"]["model"]).read_bytes())
    if escape == "link.onnx":
        (dist / "link.onnx").symlink_to(tmp_path / "outside.onnx")
    manifest = _manifest(dist)
    manifest["artifacts"]["model"] = escape
    manifest["files"][escape] = {"bytes": (tmp_path / "outside.onnx").stat().st_size, "sha256": sha256(tmp_path / "outside.onnx")}
    _save(dist, manifest)
    for call in (lambda: infopt.load(dist), lambda: validate(dist, progress=False), lambda: infopt.gate(dist, dist, memory=False)):
        with pytest.raises(UsageError, match="outside its output folder"):
            call()
    proc = run_cli_here("verify", str(dist), cwd=tmp_path)
    assert proc.returncode == 2 and "outside its output folder" in proc.stderr and "Traceback" not in proc.stderr


def _rehash(dist: Path, manifest: dict) -> dict:
    for rel in manifest["files"]:
        manifest["files"][rel] = {"bytes": (dist / rel).stat().st_size, "sha256": sha256(dist / rel)}
    return manifest


def _flip_verdict(dist: Path) -> None:
    manifest = _manifest(dist)
    manifest["validation"]["verdict"] = {"passed": True, "reasons": [], "checks": []}
    manifest["validation"]["drift"]["worst"]["cosine_min"] = 1.0
    _save(dist, manifest)


def _swap_model(dist: Path) -> None:
    """Another model in place of the built one, and the manifest's hashes made to match it."""
    model = dist / _manifest(dist)["artifacts"]["model"]
    import onnx

    proto = onnx.load(str(model))
    proto.producer_name = "someone else"
    onnx.save(proto, str(model))
    _save(dist, _rehash(dist, _manifest(dist)))


@pytest.mark.parametrize("edit", [_flip_verdict, _swap_model], ids=["flipped verdict", "swapped model, new hashes"])
def test_a_signed_manifest_edited_afterwards_is_refused_with_the_key(built, tmp_path, keys, edit):
    dist = _copy(built, tmp_path)
    proc = run_cli_here("sign", str(dist), "--key", str(keys / "ours.pem"), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    good = run_cli_here("verify", str(dist), "--key", str(keys / "ours.pub.pem"), cwd=tmp_path)
    assert good.returncode == 0 and "signature: valid" in good.stdout
    other = run_cli_here("verify", str(dist), "--key", str(keys / "theirs.pub.pem"), cwd=tmp_path)
    assert other.returncode == 1 and "signed with another key" in other.stdout

    edit(dist)
    # without the key the edit is invisible: the hashes agree with the edited manifest
    assert run_cli_here("verify", str(dist), cwd=tmp_path).returncode == 0
    infopt.load(dist, allow_failed=True)
    pub = keys / "ours.pub.pem"
    proc = run_cli_here("verify", str(dist), "--key", str(pub), cwd=tmp_path)
    assert proc.returncode == 1 and "changed after it was signed" in proc.stdout
    for call in (lambda: infopt.load(dist, key=pub), lambda: validate(dist, key=pub, progress=False),
                 lambda: infopt.gate(dist, dist, key=pub, memory=False)):
        with pytest.raises(IntegrityError, match="changed after it was signed"):
            call()
    gate = run_cli_here("gate", str(dist), "-b", str(dist), "--key", str(pub), "--no-memory", cwd=tmp_path)
    assert gate.returncode == 2 and "changed after it was signed" in gate.stderr and "Traceback" not in gate.stderr


def test_signing_refuses_a_folder_that_no_longer_matches_and_a_wrong_key_file(built, tmp_path, keys):
    dist = _copy(built, tmp_path)
    (dist / "report.md").write_text("edited\n")
    proc = run_cli_here("sign", str(dist), "--key", str(keys / "ours.pem"), cwd=tmp_path)
    assert proc.returncode == 2 and "does not match its manifest" in proc.stderr
    assert not (dist / "manifest.json.sig").exists()
    (dist / "report.md").write_bytes((built / "report.md").read_bytes())
    proc = run_cli_here("sign", str(dist), "--key", str(keys / "ours.pub.pem"), cwd=tmp_path)
    assert proc.returncode == 2 and "not an unencrypted Ed25519 private key" in proc.stderr and "openssl genpkey" in proc.stderr
    unsigned = run_cli_here("verify", str(dist), "--key", str(keys / "ours.pub.pem"), cwd=tmp_path)
    assert unsigned.returncode == 1 and "is not signed" in unsigned.stdout
