"""Signing an output folder: an Ed25519 signature over its manifest.json, in manifest.json.sig.

The manifest lists every file's sha256, so a valid signature covers every byte of the folder:
``infopt verify DIST --key PUB`` (and ``validate``, ``gate``, ``infopt.load`` with a key) refuse a
folder whose manifest was edited after it was signed, which the hashes alone cannot show (an
editor can change a file and its hash together). Keys are PEM files as OpenSSL writes them::

    openssl genpkey -algorithm ed25519 -out signing.pem
    openssl pkey -in signing.pem -pubout -out signing.pub.pem

The ``cryptography`` package (the ``sign`` extra) does the work.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

from infopt.core.errors import EnvironmentProblem, IntegrityError, UsageError
from infopt.core.manifest import MANIFEST, SIGNATURE, sha256

SCHEME = "ed25519"


def _serialization():
    try:
        from cryptography.hazmat.primitives import serialization
    except ImportError as exc:
        raise EnvironmentProblem("signing needs the cryptography package, which is not installed",
                                 fix="pip install 'infopt[sign]'") from exc
    return serialization


def _read_key(path: str | Path, private: bool):
    from cryptography.hazmat.primitives.asymmetric import ed25519

    serialization = _serialization()
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise UsageError(f"cannot read the key {path}: {exc.strerror or exc}", fix="pass the path of a PEM key file") from exc
    loaders = [serialization.load_pem_private_key] if private else [serialization.load_pem_public_key,
                                                                     serialization.load_pem_private_key]
    for loader in loaders:
        try:
            key = loader(data, None) if loader is serialization.load_pem_private_key else loader(data)
        except (ValueError, TypeError):
            continue
        if private and isinstance(key, ed25519.Ed25519PrivateKey):
            return key
        if not private and isinstance(key, ed25519.Ed25519PrivateKey):
            return key.public_key()
        if not private and isinstance(key, ed25519.Ed25519PublicKey):
            return key
    kind = "an unencrypted Ed25519 private key" if private else "an Ed25519 public (or private) key"
    raise UsageError(f"{path} is not {kind} in PEM form",
                     fix="make one with: openssl genpkey -algorithm ed25519 -out signing.pem "
                         "(public half: openssl pkey -in signing.pem -pubout -out signing.pub.pem)")


def _raw_public(public) -> str:
    serialization = _serialization()
    raw = public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return base64.b64encode(raw).decode()


def write_signature(root: str | Path, key: str | Path) -> dict[str, Any]:
    """Write ``manifest.json.sig``: the Ed25519 signature of manifest.json's bytes, and the public key's
    fingerprint. ``provenance.sign`` checks the folder against its manifest first."""
    root = Path(root)
    private = _read_key(key, private=True)
    data = (root / MANIFEST).read_bytes()
    record = {"scheme": SCHEME, "manifest_sha256": sha256(root / MANIFEST), "public_key": _raw_public(private.public_key()),
              "signature": base64.b64encode(private.sign(data)).decode()}
    (root / SIGNATURE).write_text(json.dumps(record, indent=2) + "\n")
    return record


def check_signature(root: str | Path, key: str | Path, label: str = "output") -> dict[str, Any]:
    """The signature record, if manifest.json.sig verifies with ``key``; else IntegrityError (exit 2)."""
    root = Path(root)
    public = _read_key(key, private=False)
    from cryptography.exceptions import InvalidSignature

    path = root / SIGNATURE
    where = str(path)
    if not path.is_file():
        raise IntegrityError(f"the {label} {root} is not signed (no {SIGNATURE})", where=str(root),
                             fix=f"sign it where it was built: infopt sign {root} --key PRIVATE.pem")
    try:
        record = json.loads(path.read_text())
        signature = base64.b64decode(record["signature"], validate=True)
    except (ValueError, KeyError, TypeError) as exc:
        raise IntegrityError(f"{path} is not a signature infopt wrote", where=where, fix="sign the folder again") from exc
    try:
        public.verify(signature, (root / MANIFEST).read_bytes())
    except InvalidSignature:
        same_key = record.get("public_key") == _raw_public(public)
        why = ("manifest.json was changed after it was signed" if same_key
               else "it was signed with another key than the one given")
        raise IntegrityError(f"the {label} {root}'s signature does not verify: {why}", where=where,
                             fix="rebuild and sign it again; do not deploy or gate it") from None
    return record
