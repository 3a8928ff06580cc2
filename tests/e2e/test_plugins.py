"""Plugins from other packages: a distribution that declares an ``infopt.plugins`` entry point is loaded when
infopt fills its registries (``core/plugin_loader.py``, called by ``infopt.api.registries``).

Two small packages are written here and installed for real (``pip install --target``, a folder of their own so
the shared environment is left as it was): ``toy-infopt-plugin`` registers a backend when its module is imported
and a calibration method from a ``module:function`` entry point, through infopt's own registries, as
``tests/core/test_registries.py`` does from inside a test module; ``broken-infopt-plugin``'s module raises on import.
The CLI runs in a subprocess with that folder on ``PYTHONPATH``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from importlib.metadata import EntryPoint
from pathlib import Path

import numpy as np
import pytest
import torch

from infopt.core import plugin_loader
from infopt.runtime.doctor import plugin_checks
from tests.support.cli import ROOT, run_cli

TOY_MODULE = '''
"""A toy infopt plugin: a backend and a pass with a setting of its own (``--toy-clip``) registered when this module
is imported, and a calibration method registered by ``register_calibration`` (the package's second entry point
names it)."""

import math
from pathlib import Path
from typing import ClassVar

from infopt.core.pass_api import Pass, PassDetails, PassOptions, PassOutcome, new_setting
from infopt.core.pass_api import register as register_pass
from infopt.quantize import calibrators
from infopt.runtime.backend import Backend, check, register
from infopt.runtime.runner import Runner


class DoublingRunner(Runner):
    kind = "toy-doubling"

    def __init__(self, path, input_names):
        self.scale = float(Path(path).read_text())
        self.input_names = tuple(input_names)

    def run(self, feed):
        return [feed[n] * self.scale for n in self.input_names]


def quarters(observer):
    """The observed range rounded outward to quarters: every calibrated end is a multiple of 0.25."""
    return math.floor(min(observer.lo, 0.0) * 4) / 4, math.ceil(max(observer.hi, 0.0) * 4) / 4


BACKEND = register(Backend(name="toy", representation="onnx", suffix=".toy", runner_kind="toy-doubling",
                           open_runner=lambda path, names, outs, threads=0, device="cpu": DoublingRunner(path, names),
                           checks=lambda: [check("toy backend", True, "registered by toy_infopt_plugin")]))


def register_calibration():
    calibrators.register(calibrators.Calibrator("toy", quarters, False, "the observed range rounded outward to quarters"))


class ClipOptions(PassOptions):
    SETTINGS: ClassVar[dict[str, str]] = {"clip": "toy_clip"}
    clip: float = new_setting(1e9, "Clip each weight to +/- this before INT8, for a finer grid.", "--toy-clip", gt=0)


class ClipDetails(PassDetails):
    clip: float
    clipped: int


def clip_weights(artifact, options, context):
    import onnx
    from onnx import numpy_helper

    model = onnx.load(str(artifact.path))
    clipped = 0
    for tensor in model.graph.initializer:
        values = numpy_helper.to_array(tensor)
        if values.dtype.kind == "f" and values.ndim == 2:
            clipped += int((abs(values) > options.clip).sum())
            tensor.CopyFrom(numpy_helper.from_array(values.clip(-options.clip, options.clip), tensor.name))
    path = context.workdir / "toy-clipped.onnx"
    onnx.save(model, str(path))
    return PassOutcome(artifact.derive("onnx", path=path), clipped > 0, notes=[f"clipped {clipped} weights"],
                       details=ClipDetails(clip=options.clip, clipped=clipped))


register_pass(Pass(name="toy_clip_weights", consumes="onnx", produces="onnx", run=clip_weights, options=ClipOptions,
                   details=ClipDetails, description="clips every weight matrix before INT8 (a toy)"))
'''

TOY_RECIPE = """\
name: toy-int8
precision: int8
backend: onnxruntime
description: dynamic INT8 after the toy plugin's weight clip
passes:
  - name: capture
  - name: onnx_export
  - name: toy_clip_weights
  - name: quantize_int8
    options:
      mode: dynamic
validation:
  drift:
    min_mean_cosine: 0.5
"""

BROKEN_MODULE = '''
raise RuntimeError("the broken plugin refuses to load\\nthis second line stays out of the warning")
'''


def _package(root: Path, dist: str, module: str, source: str, entry_points: dict[str, str]) -> Path:
    folder = root / dist
    folder.mkdir()
    points = "\n".join(f'"{name}" = "{value}"' for name, value in entry_points.items())
    (folder / "pyproject.toml").write_text(textwrap.dedent(f"""\
        [build-system]
        requires = ["setuptools>=61"]
        build-backend = "setuptools.build_meta"

        [project]
        name = "{dist}"
        version = "0.1.0"

        [tool.setuptools]
        py-modules = ["{module}"]

        [project.entry-points."infopt.plugins"]
        """) + points + "\n")
    (folder / f"{module}.py").write_text(source)
    return folder


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """Both packages, installed by pip into a folder of their own."""
    root = tmp_path_factory.mktemp("plugins")
    toy = _package(root, "toy-infopt-plugin", "toy_infopt_plugin", TOY_MODULE,
                   {"toy": "toy_infopt_plugin", "toy-calibration": "toy_infopt_plugin:register_calibration"})
    broken = _package(root, "broken-infopt-plugin", "broken_infopt_plugin", BROKEN_MODULE, {"broken": "broken_infopt_plugin"})
    target = root / "site"
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-build-isolation", "--no-index",
                           "--quiet", "--target", str(target), str(toy), str(broken)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert sorted(p.name for p in target.glob("*.dist-info")) == ["broken_infopt_plugin-0.1.0.dist-info",
                                                                  "toy_infopt_plugin-0.1.0.dist-info"]
    return target


def _with_plugins(site: Path) -> dict[str, str]:
    return {"PYTHONPATH": os.pathsep.join([str(site), str(ROOT)])}


def _warnings(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if "infopt.plugins" in line]


def _table_rows(text: str) -> dict[str, list[str]]:
    """A rich table's rows by their first cell, each cell's wrapped lines joined."""
    rows: list[list[str]] = []
    for line in text.splitlines():
        if line.startswith("│"):
            cells = [c.strip() for c in line.strip("│").split("│")]
            if cells[0] or not rows:
                rows.append(cells)
            else:
                rows[-1] = [f"{a} {b}".strip() for a, b in zip(rows[-1], cells)]
    return {row[0]: row for row in rows}


def test_doctor_lists_each_plugin_loaded_or_with_its_error(site, tmp_path):
    proc = run_cli("doctor", "--json", cwd=tmp_path, env=_with_plugins(site))
    assert proc.returncode == 0, proc.stderr
    rows = {row["component"]: row for row in json.loads(proc.stdout)}
    assert rows["plugin toy"]["ok"] and rows["plugin toy"]["plugin"] == {
        "name": "toy", "distribution": "toy-infopt-plugin", "version": "0.1.0", "module": "toy_infopt_plugin",
        "loaded": True, "error": None}
    assert rows["plugin toy-calibration"]["plugin"]["loaded"]
    assert rows["plugin toy-calibration"]["plugin"]["module"] == "toy_infopt_plugin:register_calibration"
    assert rows["toy backend"]["ok"]  # the plugin's backend is in the registry the doctor asks
    broken = rows["plugin broken"]
    assert not broken["ok"] and broken["plugin"]["distribution"] == "broken-infopt-plugin"
    assert broken["plugin"]["error"] == "RuntimeError: the broken plugin refuses to load"
    assert "pip uninstall broken-infopt-plugin" in broken["fix"]
    assert "plugins" not in rows  # the row saying none are installed
    assert len(_warnings(proc.stderr)) == 1

    proc = run_cli("doctor", cwd=tmp_path, env=_with_plugins(site))  # the table, as a user reads it
    assert proc.returncode == 0, proc.stderr
    table = _table_rows(proc.stdout)
    assert table["plugin toy"][1:3] == ["yes", "toy_infopt_plugin from toy-infopt-plugin 0.1.0: loaded"]
    assert table["plugin broken"][1:3] == ["no", "broken_infopt_plugin from broken-infopt-plugin 0.1.0: failed: "
                                                 "RuntimeError: the broken plugin refuses to load"]

    none, = plugin_checks(())  # where no package declares one, the doctor says where they would come from
    assert none["component"] == "plugins" and "'infopt.plugins' entry point" in none["detail"]


def test_a_cli_build_calibrates_with_the_plugins_method_and_skips_the_broken_plugin(site, tmp_path):
    """A static INT8 build from the command line, with relative paths, takes ``--calib-method toy``: the method
    only the plugin registers. The broken plugin is one warning line on stderr and the build exits 0."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4)).eval()
    torch.jit.save(torch.jit.trace(model, torch.randn(2, 16)), str(tmp_path / "mlp.pt"))
    np.savez(tmp_path / "calib.npz", x=np.random.default_rng(0).normal(size=(32, 16)).astype(np.float32))
    args = ("build", "mlp.pt", "--input", "x:float32[batch,16]", "--int8", "--calib", "calib.npz", "--calib-method", "toy",
            "--backend", "onnxruntime", "--batch-sizes", "1", "--max-drift", "cosine_mean=0.9", "--require-precision",
            "--quiet", "--output", "out")
    proc = run_cli(*args, cwd=tmp_path, env={**_with_plugins(site), "INFOPT_CACHE_DIR": str(tmp_path / "cache")})
    assert proc.returncode == 0, proc.stderr[-3000:]
    warning, = _warnings(proc.stderr)
    assert "plugin 'broken' (broken-infopt-plugin 0.1.0, broken_infopt_plugin) failed to load and was skipped" in warning
    assert "RuntimeError: the broken plugin refuses to load" in warning and "pip uninstall broken-infopt-plugin" in warning
    assert "second line" not in proc.stderr

    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    int8, = [p for p in manifest["passes"] if p["name"] == "quantize_int8" and not p.get("skipped")]
    assert int8["details"]["calibration"]["method"] == "toy"
    table = json.loads((tmp_path / "out" / "quantization" / "calibration.json").read_text())
    ends = [end for pair in table["ranges"].values() for end in pair]
    assert table["method"] == "toy" and any(ends)
    assert all(end * 4 == round(end * 4) for end in ends), ends  # the toy rule's quarters, not min and max

    refused = run_cli(*args[:-1], "refused", cwd=tmp_path)  # without the plugin the method is unknown
    assert refused.returncode == 2 and "unknown --calib-method 'toy'" in refused.stderr


def test_a_plugins_pass_adds_an_int8_option_that_a_cli_build_takes(site, tmp_path):
    """The toy plugin's pass declares ``toy_clip`` with its flag: ``infopt build --help`` lists ``--toy-clip``, and a
    build from the command line with a recipe that runs the pass before INT8 hands it the flag's value. A bad value
    exits 2 naming the flag; without the plugin the flag is no option at all."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4)).eval()
    torch.jit.save(torch.jit.trace(model, torch.randn(2, 3, 16)), str(tmp_path / "mlp.pt"))  # MatMuls, not Gemms
    (tmp_path / "toy-int8.yaml").write_text(TOY_RECIPE)
    env = {**_with_plugins(site), "INFOPT_CACHE_DIR": str(tmp_path / "cache")}
    shown = run_cli("build", "--help", cwd=tmp_path, env={**env, "COLUMNS": "200"})
    assert shown.returncode == 0 and "--toy-clip" in shown.stdout and "Clip each weight" in shown.stdout

    args = ("build", "mlp.pt", "--input", "x:float32[batch,3,16]", "--recipe", "toy-int8.yaml", "--batch-sizes", "1",
            "--require-precision", "--quiet", "--json")
    proc = run_cli(*args, "--toy-clip", "0.2", "--output", "out", cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    clip, = [p for p in manifest["passes"] if p["name"] == "toy_clip_weights"]
    assert clip["details"]["clip"] == 0.2 and clip["details"]["clipped"] > 0  # the flag's value, not the default
    int8, = [p for p in manifest["passes"] if p["name"] == "quantize_int8"]
    assert manifest["precision"] == "int8" and len(int8["details"]["layers"]) == 2
    assert manifest["provenance"]["settings"]["toy_clip"] == 0.2

    bad = run_cli(*args, "--toy-clip", "-1", "--output", "bad", cwd=tmp_path, env=env)
    assert bad.returncode == 2 and "--toy-clip" in bad.stderr and "greater than 0" in bad.stderr
    assert not (tmp_path / "bad").exists()
    unknown = run_cli(*args, "--toy-clip", "0.2", "--output", "none", cwd=tmp_path)  # the plugin not installed
    assert unknown.returncode == 2 and "No such option: --toy-clip" in unknown.stderr


def test_loading_twice_is_a_no_op_and_a_failure_is_a_plugins_error(site, monkeypatch):
    """In this process: a second ``load_plugins`` loads nothing again (the toy's function would register its
    method twice, an error); an entry point whose function is missing or raises becomes that plugin's error."""
    from infopt.core.pass_api import PASSES
    from infopt.quantize import calibrators
    from infopt.runtime import backend as backend_registry

    monkeypatch.syspath_prepend(str(site))
    # what the toy registers is gone after the test: its pass would give later tests' configs its setting
    monkeypatch.setattr(PASSES, "items", dict(PASSES.items))
    monkeypatch.setattr(backend_registry.BACKENDS, "items", dict(backend_registry.BACKENDS.items))
    monkeypatch.setattr(calibrators.CALIBRATORS, "items", dict(calibrators.CALIBRATORS.items))
    plugin_loader.load_plugins.cache_clear()
    try:
        first = plugin_loader.load_plugins()
        assert [(p.name, p.loaded) for p in first] == [("broken", False), ("toy", True), ("toy-calibration", True)]
        assert plugin_loader.load_plugins() is first
        assert "toy" in calibrators.names() and backend_registry.named("toy").suffix == ".toy"
        assert "toy_clip_weights" in PASSES.all()

        missing = plugin_loader.load(EntryPoint("missing", "toy_infopt_plugin:no_such_function", plugin_loader.GROUP))
        assert not missing.loaded and missing.error.startswith("AttributeError:")
        assert missing.distribution == "(unknown distribution)"
        again = plugin_loader.load(EntryPoint("twice", "toy_infopt_plugin:register_calibration", plugin_loader.GROUP))
        assert again.error == "ValueError: calibration method 'toy' is registered twice"
    finally:
        plugin_loader.load_plugins.cache_clear()
        sys.modules.pop("toy_infopt_plugin", None)
