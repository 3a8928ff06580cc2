"""``infopt verify DIST``: check an output folder's files against its manifest, nothing else."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from infopt.cli import options as o
from infopt.cli.output import print_json, stdout, table


def verify(
    dist: Annotated[Path, typer.Argument(help="An output folder written by `infopt build` (or its manifest.json).")],
    key: Annotated[Optional[Path], typer.Option("--key", help="Ed25519 public key (PEM): also check manifest.json.sig, the signature `infopt sign` wrote.")] = None,
    as_json: o.Json = False,
) -> None:
    """Re-hash every file against the manifest (and, with --key, check its signature); exit 1 on
    any changed, missing or added file or a signature that does not verify."""
    from infopt.api.provenance import verify as run_verify
    from infopt.core.manifest import output_root

    result = run_verify(output_root(dist), key)
    if as_json:
        print_json(result)
    else:
        console = stdout()
        rows = [[f["path"], f["status"] if f["status"] == "ok" else f["status"].upper(), f["bytes"] if f["bytes"] is not None else "-",
                 (f["sha256"] or "-")[:16]] for f in result["files"]]
        console.print(table(f"{result['name']}: files against manifest.json", ["path", "status", "bytes", "sha256 (first 16)"], rows))
        prov = result.get("provenance") or {}
        made_by = prov.get("command") or prov.get("python_call")
        if made_by:
            console.print(f"built by: {made_by}", markup=False)
        console.print(f"manifest.json sha256: {result['manifest_sha256']}", markup=False)
        if result["signature"]:
            console.print(f"signature: {result['signature']}", markup=False)
        if result["passed"]:
            console.print(f"OK: all {len(result['files'])} files match", style="bold green", markup=False)
        else:
            console.print("MISMATCH: " + "; ".join(result["problems"]), style="bold red", markup=False, soft_wrap=True)
    if not result["passed"]:
        raise typer.Exit(1)


def sign(
    dist: Annotated[Path, typer.Argument(help="An output folder written by `infopt build`.")],
    key: Annotated[Path, typer.Option("--key", help="Ed25519 private key (PEM, unencrypted), e.g. from `openssl genpkey -algorithm ed25519`.")],
) -> None:
    """Sign an output folder: an Ed25519 signature over its manifest.json, written to manifest.json.sig."""
    from infopt.api.provenance import sign as run_sign
    from infopt.core.manifest import output_root

    root = output_root(dist)
    record = run_sign(root, key)
    stdout().print(f"signed {root}/manifest.json (sha256 {record['manifest_sha256'][:16]}...) with the Ed25519 key "
                   f"{record['public_key']}; wrote {root}/manifest.json.sig", markup=False)
