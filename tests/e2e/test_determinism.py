"""Two builds of the same model with the same options, from the command line in two folders: the
``model/`` files are byte-identical and the manifests differ only in the fields documented as volatile
(``emit.VOLATILE_KEYS``: the build time and timings; ``VOLATILE_FILES``: reports and server files)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
import yaml

from infopt.api.emit import VOLATILE_FILES, without_volatile
from tests.support.cli import run_cli
from tests.support.payloads import Tiny

RECIPES = Path(__file__).resolve().parents[2] / "recipes" / "pipelines"


@pytest.mark.slow
def test_the_same_build_twice_gives_the_same_model_bytes_and_manifest(tmp_path):
    torch.manual_seed(3)
    torch.jit.save(torch.jit.trace(Tiny().eval(), torch.randn(2, 4)), str(tmp_path / "tiny.pt"))
    manifests, models = [], []
    for side in ("a", "b"):
        folder = tmp_path / side
        folder.mkdir()
        shutil.copy(tmp_path / "tiny.pt", folder / "tiny.pt")
        recipe = yaml.safe_load((RECIPES / "int8-onnxruntime.yaml").read_text())
        next(p for p in recipe["passes"] if p["name"] == "quantize_int8")["options"]["choose"] = "first"
        (folder / "int8-first.yaml").write_text(yaml.safe_dump(recipe))
        # choose: first: INT8's choice among its variants by timing is volatile (emit.VOLATILE_KEYS)
        proc = run_cli("build", "tiny.pt", "--input", "x:float32[batch,4]", "--recipe", "int8-first.yaml", "-q",
                       cwd=folder)
        assert proc.returncode == 0, proc.stderr[-2000:]
        dist = folder / "dist" / "tiny"
        models.append({p.relative_to(dist).as_posix(): p.read_bytes() for p in sorted((dist / "model").rglob("*")) if p.is_file()})
        manifests.append(json.loads((dist / "manifest.json").read_text()))
    assert models[0] and models[0] == models[1]
    assert manifests[0]["created"] and manifests[0]["validation"]["latency"]  # volatile fields there, and left out below
    stable = [without_volatile(m) for m in manifests]
    assert stable[0] == stable[1]
    listed = set(stable[0]["files"])
    assert {"model/model.onnx", "validation/samples.npz"} <= listed
    assert not any(rel.startswith(VOLATILE_FILES) for rel in listed)
