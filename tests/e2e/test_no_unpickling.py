"""No route from a user's file to running its code: each file here runs code when unpickled (it writes
a marker file), and each command that reads it refuses it, exit 2, without the marker appearing.
The commands run through the CLI's entry point in this process, so a payload that ran would run here.
Given ``--allow-pickle`` (the user's consent) the model files do run it: the payloads are live."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from infopt.core.manifest import sha256
from tests.support import payloads
from tests.support.cli import run_cli_here

TINY_INPUT = ("--input", "x:float32[batch,4]")


def _tiny_ts(folder: Path) -> Path:
    path = folder / "tiny.pt"
    torch.jit.save(torch.jit.trace(payloads.Tiny().eval(), torch.randn(2, 4)), str(path))
    return path


def _hf_folder_with_bin(folder: Path, marker: Path) -> Path:
    hf = folder / "hf"
    hf.mkdir()
    (hf / "config.json").write_text(json.dumps({"model_type": "bert", "architectures": ["BertModel"]}))
    payloads.state_dict_with_payload(hf / "pytorch_model.bin", marker)
    return hf


def _tampered_samples(folder: Path, marker: Path, dist: Path) -> Path:
    """A build whose stored samples were swapped for object arrays, with the manifest's hash made to match."""
    copy = folder / "dist"
    shutil.copytree(dist, copy)
    samples = copy / "validation" / "samples.npz"
    payloads.object_npz(samples, marker, name="input.x")
    manifest = json.loads((copy / "manifest.json").read_text())
    manifest["files"]["validation/samples.npz"] = {"bytes": samples.stat().st_size, "sha256": sha256(samples)}
    (copy / "manifest.json").write_text(json.dumps(manifest))
    return copy


# route: (make the file in folder with the marker (and a build), the command's arguments)
ROUTES = {
    "build pickled module": (lambda f, m, d: payloads.pickled_module(f / "m.pt", m), ["build", "m.pt", *TINY_INPUT]),
    "inspect pickled module": (lambda f, m, d: payloads.pickled_module(f / "m.pt", m), ["inspect", "m.pt", *TINY_INPUT]),
    "build state_dict with an object": (lambda f, m, d: payloads.state_dict_with_payload(f / "m.pt", m),
                                        ["build", "m.pt", "--model-class", "tests.support.payloads:Tiny", *TINY_INPUT]),
    "build legacy torch.save format": (lambda f, m, d: payloads.legacy_format_payload(f / "m.pt", m),
                                       ["build", "m.pt", "--model-class", "tests.support.payloads:Tiny", *TINY_INPUT]),
    "build .pt2 use_pickle weight": (lambda f, m, d: payloads.pt2_use_pickle(f / "m.pt2", m), ["build", "m.pt2"]),
    "inspect .pt2 use_pickle weight": (lambda f, m, d: payloads.pt2_use_pickle(f / "m.pt2", m), ["inspect", "m.pt2"]),
    "build .pt2 legacy weights file": (lambda f, m, d: payloads.pt2_legacy_weights(f / "m.pt2", m), ["build", "m.pt2"]),
    "inspect .pt2 legacy constants file": (lambda f, m, d: payloads.pt2_legacy_constants(f / "m.pt2", m), ["inspect", "m.pt2"]),
    "build .pt2 pickled sample inputs": (lambda f, m, d: payloads.pt2_sample_inputs(f / "m.pt2", m), ["build", "m.pt2"]),
    "build .pt2 opaque object": (lambda f, m, d: payloads.pt2_opaque_object(f / "m.pt2", m), ["build", "m.pt2"]),
    "build TorchScript look-alike": (lambda f, m, d: payloads.torchscript_lookalike(f / "m.pt", m), ["build", "m.pt", *TINY_INPUT]),
    "build Hugging Face folder with a .bin": (lambda f, m, d: _hf_folder_with_bin(f, m), ["build", "hf"]),
    "build --val .pt": (lambda f, m, d: (_tiny_ts(f), payloads.samples_pt(f / "v.pt", m)),
                        ["build", "tiny.pt", *TINY_INPUT, "--val", "v.pt"]),
    "build --val object .npy": (lambda f, m, d: (_tiny_ts(f), payloads.object_npy(f / "v.npy", m)),
                                ["build", "tiny.pt", *TINY_INPUT, "--val", "v.npy"]),
    "build --calib .pt": (lambda f, m, d: (_tiny_ts(f), payloads.samples_pt(f / "c.pt", m)),
                          ["build", "tiny.pt", *TINY_INPUT, "--int8", "--calib", "c.pt"]),
    "build --calib object .npz": (lambda f, m, d: (_tiny_ts(f), payloads.object_npz(f / "c.npz", m)),
                                  ["build", "tiny.pt", *TINY_INPUT, "--int8", "--calib", "c.npz"]),
    "build --recipe YAML tag": (lambda f, m, d: (_tiny_ts(f), payloads.yaml_python_tag(f / "r.yaml", m)),
                                ["build", "tiny.pt", *TINY_INPUT, "--recipe", "r.yaml"]),
    "inspect --val .pt": (lambda f, m, d: (_tiny_ts(f), payloads.samples_pt(f / "v.pt", m)), ["inspect", "tiny.pt", "--val", "v.pt"]),
    "gate --val .pt": (lambda f, m, d: payloads.samples_pt(f / "v.pt", m),
                       ["gate", "{dist}", "-b", "{dist}", "--val", "v.pt", "--no-memory"]),
    "gate --gate-file YAML tag": (lambda f, m, d: payloads.yaml_python_tag(f / "g.yaml", m),
                                  ["gate", "{dist}", "-b", "{dist}", "--gate-file", "g.yaml", "--no-memory"]),
    "validate stored samples": (lambda f, m, d: _tampered_samples(f, m, d), ["validate", "dist"]),
}


@pytest.mark.parametrize("route", sorted(ROUTES))
def test_a_planted_payload_never_runs(route, tmp_path, digits_dist):
    make, args = ROUTES[route]
    marker = tmp_path / "MARKER"
    make(tmp_path, marker, digits_dist)
    proc = run_cli_here(*[a.format(dist=digits_dist) for a in args], cwd=tmp_path)
    assert not marker.exists(), f"{route}: the payload ran"
    assert proc.returncode == 2, (route, proc.returncode, proc.stderr[-2000:])
    assert "Traceback" not in proc.stderr and "error" in proc.stderr
    assert not (tmp_path / "dist" / "m").exists() and not (tmp_path / "dist" / "tiny").exists()


@pytest.mark.parametrize("route", ["build pickled module", "inspect .pt2 use_pickle weight", "build .pt2 pickled sample inputs",
                                   "build .pt2 opaque object"])
def test_with_consent_the_payload_runs(route, tmp_path):
    make, args = ROUTES[route]
    marker = tmp_path / "MARKER"
    make(tmp_path, marker, None)
    run_cli_here(*args, "--allow-pickle", cwd=tmp_path)
    assert marker.read_text() == "ran"
