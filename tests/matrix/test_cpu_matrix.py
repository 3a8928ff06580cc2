"""Every CPU cell of the target table in docs/guide/targets-and-backends.md, from the command line, the way users
call it.

Each cell runs ``infopt build`` in a fresh working directory, on a model file given by a relative
path, with the default output folder (``dist/<name>``), over five architectures that break builds
in different places (tests/matrix/models.py), each saved in two source formats. A cell asserts the
exit code, the file that ships and the drift the manifest records. The cells come from the code
(:func:`infopt.core.recipe.build_table`), so a precision or backend added to the CPU target is covered
as soon as it is claimed.
"""

from __future__ import annotations

import json
import shutil
import sys

import numpy as np
import pytest

from infopt.core.recipe import build_table, build_table_markdown
from tests.matrix import models as M

SECOND_FORMAT = {"ConvBN": "torchscript", "AttentionEncoder": "torchscript", "Recurrent": "torchscript",
                 "OddMLP": "torchscript", "TwoHeads": "pt2"}
"""Besides its state dict, each architecture is built from one file that holds no Python module."""

SHIPPED = {"onnxruntime": "model/model.onnx", "inductor": "model/model.pt2"}
FLOOR = {"fp32": ("sqnr_db", 60.0), "bf16": ("cosine_mean", 0.995), "fp8": ("cosine_mean", 0.99), "int8": ("cosine_mean", 0.99),
         "int4": ("cosine_mean", 0.98)}
"""The drift each cell must show in its manifest (the recipes' own limits)."""


def cpu_cells() -> list[tuple[str, str, str]]:
    """(precision, backend, int8 mode) for every CPU cell the guide's target table claims."""
    cells = []
    for precision, backends in build_table()["cpu"].items():
        for backend in backends:
            modes = ("static", "dynamic") if precision == "int8" else ("",)
            cells += [(precision, backend, mode) for mode in modes]
    return cells


KNOWN_BROKEN: dict[tuple[str, str, str], str] = {}
"""Cells that fail today, kept in the matrix (strict xfail: fixing one turns the test red until it is removed)."""


def _case(arch, fmt, precision, backend, mode):
    marks = []
    if (arch, precision, backend) in KNOWN_BROKEN:
        marks.append(pytest.mark.xfail(strict=True, reason=KNOWN_BROKEN[arch, precision, backend]))
    return pytest.param(arch, fmt, precision, backend, mode, marks=marks,
                        id=f"{arch}-{fmt}-{precision}{'-' + mode if mode else ''}-{backend}")


CASES = [_case(arch, fmt, *cell) for arch in M.ARCHITECTURES for fmt in ("state_dict", SECOND_FORMAT[arch])
         for cell in cpu_cells()
         # INT4 through Inductor needs the Python module: from a file without one it is exit 2 by design
         # (tests/matrix/test_partial_and_routes.py), and the onnxruntime cell covers that file
         if not (fmt != "state_dict" and cell[:2] == ("int4", "inductor"))]


@pytest.fixture(scope="session")
def saved(tmp_path_factory):
    """Each architecture saved in each of its formats, with calibration and validation samples."""
    root = tmp_path_factory.mktemp("matrix-models")
    cache = {}

    def get(arch: str, fmt: str):
        if (arch, fmt) not in cache:
            file, args = M.save(arch, fmt, root)
            np.savez(root / f"{arch}_calib.npz", **M.samples(arch, 32, seed=1))
            cache[arch, fmt] = (root / file, args, root / f"{arch}_calib.npz")
        return cache[arch, fmt]

    return get


def run_infopt(args: list[str], monkeypatch, capsys) -> tuple[int, str, str]:
    """``infopt ARGS`` through the CLI's own entry point, in this process (no interpreter start-up per cell)."""
    from infopt.cli.app import main

    monkeypatch.setattr(sys, "argv", ["infopt", *args])
    try:
        main()
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("arch, fmt, precision, backend, mode", CASES)
def test_cell(arch, fmt, precision, backend, mode, saved, tmp_path, monkeypatch, capsys):
    source, load_args, calib = saved(arch, fmt)
    monkeypatch.chdir(tmp_path)
    shutil.copy(source, source.name)
    extra = []
    if mode == "static" or precision == "fp8":  # FP8's activation scales are calibrated
        shutil.copy(calib, "calib.npz")
        extra = ["--calib", "calib.npz"]
    dims = [arg for name, (lo, opt, hi) in M.DIMS.items() if any(f",{name}," in f",{i.split('[')[1]}"
                                                                for i in M.ARCHITECTURES[arch].inputs)
            for arg in ("--dim", f"{name}={lo}:{opt}:{hi}")] if fmt != "pt2" else []  # a .pt2 carries its dims
    code, out, err = run_infopt(["build", source.name, *load_args, *dims, f"--{precision}", "--backend", backend,
                                 "--batch-sizes", "1", "-q", *extra], monkeypatch, capsys)
    assert code == 0, f"exit {code}\n{err[-3000:]}\n{out[-2000:]}"
    name = source.stem
    dist = tmp_path / "dist" / name
    manifest = json.loads((dist / "manifest.json").read_text())
    assert (dist / SHIPPED[backend]).is_file()
    passes = {p["name"]: p for p in manifest["passes"]}
    assert manifest["backend"] == backend
    if manifest["precision"] == "fp32" and precision == "int8":  # no INT8 graph was faster than FP32 here
        assert manifest["precision_asked"] == "int8" and passes["quantize_int8"]["details"]["shipped"] == "fp32"
        assert all(v["speed_vs_fp32"] >= 1 for v in passes["quantize_int8"]["details"]["variants"] if v["speed_vs_fp32"])
    else:
        assert manifest["precision"] == precision
    assert manifest["validation"]["verdict"]["passed"], manifest["validation"]["verdict"]
    metric, floor = FLOOR[precision]
    figure = float(manifest["validation"]["drift"]["worst"][metric])  # "inf" for identical outputs
    assert figure >= floor, f"{metric} {figure} < {floor}"
    assert f"wrote dist/{name}/" in out
    if precision == "int8":
        details = passes["quantize_int8"]["details"]
        assert details["mode"] == mode
        if mode == "static":  # judged on calibration samples held out of the draw, not on noise
            assert manifest["validation"]["drift"]["source"].endswith("(held out of calibration)")
    if precision == "int4":
        quantized = [p for p in manifest["passes"] if p["name"].startswith("quantize_int4") and p["changed"]]
        assert len(quantized) == 1 and quantized[0]["details"]["layers"], manifest["passes"]
    if precision == "bf16":
        assert passes["cast_precision"]["changed"]
    if precision == "fp8":
        assert passes["quantize_fp8"]["details"]["fp8_ops"]["QuantizeLinear"] > 0


def test_the_guide_s_target_table_is_the_code_s_table():
    from tests.support.cli import ROOT

    assert build_table_markdown() in (ROOT / "docs" / "guide" / "targets-and-backends.md").read_text()
    assert build_table()["cpu"] == {"fp32": ["onnxruntime", "inductor"], "bf16": ["inductor"], "fp8": ["onnxruntime"],
                                    "int8": ["onnxruntime"], "int4": ["onnxruntime", "inductor"]}
