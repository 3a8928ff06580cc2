"""The typed manifest: the shipped JSON schema is the models', a build's manifest fits them, and a
manifest that does not is refused by every reader with a clear error and exit 2."""

from __future__ import annotations

import json
import shutil

import pytest

from infopt.core.errors import BuildError, UsageError
from infopt.core.manifest import read_manifest
from infopt.core.manifest_schema import SCHEMA_VERSION, Manifest, check_written, json_schema, shipped_schema
from tests.support.cli import run_cli_here


def test_the_shipped_schema_is_generated_from_the_models():
    assert shipped_schema() == json.loads(json.dumps(json_schema())), \
        "regenerate it: python -m infopt.core.manifest_schema > core/manifest.schema.json"
    assert shipped_schema()["properties"]["schema"]["const"] == SCHEMA_VERSION
    assert {"name", "inputs", "outputs", "validation", "artifacts", "files"} <= set(shipped_schema()["required"])


def test_a_build_manifest_fits_its_types_and_reads_back_as_written(digits_dist):
    raw = json.loads((digits_dist / "manifest.json").read_text())
    typed = read_manifest(digits_dist)
    assert isinstance(typed, Manifest) and typed.to_json() == raw
    assert typed.artifacts.model == "model/model.onnx" and typed.target.device == "cpu"
    assert typed.validation.verdict.passed is True and typed.inputs.dims["batch"].max == 16
    assert all(entry.sha256 == raw["files"][rel]["sha256"] for rel, entry in typed.files.items())
    assert typed.provenance is not None and typed.provenance.validation_data.samples > 0
    assert typed.pass_record("onnx_export").consumes == "exported" and typed.pass_record("no_such_pass") is None


def _edited(digits_dist, tmp_path, edit):
    dist = tmp_path / "digits"
    shutil.copytree(digits_dist, dist)
    manifest = json.loads((dist / "manifest.json").read_text())
    edit(manifest)
    (dist / "manifest.json").write_text(json.dumps(manifest))
    return dist


EDITS = {
    "no verdict": (lambda m: m["validation"].pop("verdict"), "validation.verdict: Field required"),
    "outputs as text": (lambda m: m.__setitem__("outputs", "x"), "outputs: Input should be a valid list"),
    "a newer schema": (lambda m: m.__setitem__("schema", "infopt.manifest/2"), "this infopt reads infopt.manifest/1"),
    "no model": (lambda m: m["artifacts"].pop("model"), "artifacts.model: Field required"),
}


@pytest.mark.parametrize("case", sorted(EDITS))
def test_every_reader_refuses_a_manifest_that_does_not_fit(case, digits_dist, tmp_path):
    edit, said = EDITS[case]
    dist = _edited(digits_dist, tmp_path, edit)
    with pytest.raises(UsageError, match="manifest") as caught:
        read_manifest(dist)
    assert said in str(caught.value)
    for command in (["validate", "digits"], ["gate", "digits", "-b", "digits", "--no-memory"], ["verify", "digits"]):
        done = run_cli_here(*command, cwd=tmp_path)
        assert done.returncode == 2, (command, done.stderr)
        assert said in done.stderr and "Traceback" not in done.stderr and "fix:" in done.stderr


def test_a_build_that_makes_a_bad_manifest_writes_nothing_and_says_so(digits_dist):
    manifest = read_manifest(digits_dist).to_json()
    manifest["validation"]["verdict"]["passed"] = "perhaps"
    with pytest.raises(BuildError, match="does not fit infopt.manifest/1: validation.verdict.passed"):
        check_written(manifest)
