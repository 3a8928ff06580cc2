"""A sweep file (``infopt sweep sweep.yaml``): models x targets x precisions x backends, each cell one
ordinary build. This module reads the file and lays out the cells; ``api/sweep.py`` runs them and
``report/sweep.py`` compares them.

    output: sweeps/nightly           # every cell under <output>/<model>/<target>-<precision>-<backend>/
    models:
      - name: digits                 # default: the model file's stem
        model: model.pt              # anything `infopt build` takes, relative to the sweep file
        inputs: ["x:float32[batch,1,8,8]"]
        dims: ["batch=1:8:64"]
        val: data/val/
        calib: data/calib/           # INT8 cells are static with it
        task: text-generation        # optional: --task for this model's cells (a causal LM's default otherwise)
    targets: [cpu, h100]
    precisions: [fp32, int8, int4]
    backends: [auto]
    max_drift: cosine_mean=0.99      # and any threshold flag: max_abs, min_cosine, min_top1, ...
    batch_sizes: [1, 8]
    timeout_s: 1800                  # a cell still running then is stopped and reported
    cpus_per_cell: 2                 # cores one build takes (local pool size, CPUs of a Ray task)
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Literal, Optional

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from infopt.core.errors import InfoptError, UsageError
from infopt.core.recipe import recipes_for
from infopt.core.target import Precision, get_target
from infopt.core.yaml_files import load_yaml

THRESHOLD_FLAGS = ("max_abs", "min_cosine", "min_top1", "min_sqnr_db", "max_p99_ms")


class SweepModel(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: str
    """a path relative to the sweep file, or a Hugging Face id"""
    name: Optional[str] = None
    inputs: list[str] = Field(default_factory=list)
    dims: list[str] = Field(default_factory=list)
    model_class: Optional[str] = None
    model_args: Optional[str] = None
    val: Optional[str] = None
    calib: Optional[str] = None
    tokenizer: Optional[str] = None
    task: Optional[Literal["text-generation", "logits"]] = None
    """``--task`` for this model's cells; unset, ``infopt build`` chooses (text-generation for a causal LM where it
    builds the cell's precision, target and backend)"""
    timeout_s: Optional[float] = Field(None, gt=0)
    """this model's cells' timeout, instead of the sweep's"""


class SweepSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    output: str = "sweeps/sweep"
    models: list[SweepModel] = Field(min_length=1)
    targets: list[str] = Field(default_factory=lambda: ["cpu"], min_length=1)
    precisions: list[Precision] = Field(default_factory=lambda: ["fp32"], min_length=1)
    backends: list[str] = Field(default_factory=lambda: ["auto"], min_length=1)
    batch_sizes: list[int] = Field(default_factory=list)
    max_drift: Optional[str] = None
    max_abs: Optional[float] = None
    min_cosine: Optional[float] = None
    min_top1: Optional[float] = None
    min_sqnr_db: Optional[float] = None
    max_p99_ms: Optional[float] = None
    timeout_s: float = Field(1800, gt=0)
    cpus_per_cell: int = Field(2, ge=1)
    """cores one build takes: the local pool's default size, and a cell's CPUs on Ray"""


@dataclass
class Cell:
    """One build of a sweep: its place in the grid, the command line that builds it, and why not when
    the target cannot run it."""

    model: str
    target: str
    precision: str
    backend: str
    folder: Path
    args: list[str]
    """``infopt build`` arguments, paths absolute"""
    cwd: Path
    timeout_s: float = 1800.0
    unsupported: str | None = None

    @property
    def label(self) -> str:
        return f"{self.target}-{self.precision}-{self.backend}"

    def inputs(self) -> list[Path]:
        """The local files and folders the command names (not its own output folder), once each."""
        found: list[Path] = []
        for arg in self.args:
            path = Path(arg)
            if path.is_absolute() and path.exists() and path != self.folder and path not in found:
                found.append(path)
        return found

    @cached_property
    def key(self) -> str:
        """sha256 over the command and the content of every input file it names: equal keys build the
        same thing. Taken once, before the cell builds, so it is the key of the inputs the build read."""
        digest = hashlib.sha256(json.dumps(self.args).encode())
        for path in self.inputs():
            for part in sorted(p for p in ([path] if path.is_file() else path.rglob("*")) if p.is_file()):
                digest.update(part.read_bytes())
        return digest.hexdigest()


def read_sweep(path: str | Path) -> SweepSpec:
    path = Path(path)
    try:
        raw = load_yaml(path.read_text())
    except OSError as exc:
        raise UsageError(f"cannot read the sweep file {path}: {exc.strerror}", fix="pass the path of a sweep YAML file") from exc
    except yaml.YAMLError as exc:
        raise UsageError(f"{path} is not valid YAML: {exc}", where=str(path)) from exc
    try:
        spec = SweepSpec.model_validate(raw or {})
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(map(str, first["loc"])) or "(top)"
        raise UsageError(f"{path}: {where}: {first['msg']}", where=str(path),
                         fix="see the sweep file format in docs/guide/sweeps.md") from None
    for name in spec.targets:
        get_target(name)  # an unknown target is the file's mistake (exit 2), not a cell's
    return spec


def _local(base: Path, value: str | None) -> str | None:
    """A path relative to the sweep file made absolute; anything else (a hub id, module:function) as it is."""
    if value is None:
        return None
    path = base / value
    return str(path.resolve()) if path.exists() else value


def cells(spec: SweepSpec, base: Path, root: Path) -> list[Cell]:
    """Every cell of the grid, in model, target, precision, backend order."""
    found = []
    shared = [a for key in THRESHOLD_FLAGS if (value := getattr(spec, key)) is not None
              for a in (f"--{key.replace('_', '-')}", str(value))]
    if spec.max_drift:
        shared += ["--max-drift", spec.max_drift]
    if spec.batch_sizes:
        shared += ["--batch-sizes", ",".join(map(str, spec.batch_sizes))]
    for m in spec.models:
        model = _local(base, m.model)
        name = m.name or Path(m.model).stem.replace("/", "_")
        own = [a for i in m.inputs for a in ("--input", i)] + [a for d in m.dims for a in ("--dim", d)]
        for flag, value in (("--model-class", m.model_class), ("--model-args", m.model_args), ("--val", _local(base, m.val)),
                            ("--tokenizer", _local(base, m.tokenizer)), ("--task", m.task)):
            if value is not None:
                own += [flag, value]
        for target in spec.targets:
            for precision in spec.precisions:
                for backend in spec.backends:
                    folder = root / name / f"{target}-{precision}-{backend}"
                    args = [model, "--target", target, "--precision", precision, "--backend", backend, *own, *shared,
                            "--name", name, "--output", str(folder), "--force"]
                    if (precision == "int4" if m.task == "text-generation" else precision == "int8") and m.calib is not None:
                        args += ["--calib", _local(base, m.calib)]
                    found.append(Cell(name, target, precision, backend, folder, args, base, m.timeout_s or spec.timeout_s,
                                      _unsupported(target, precision, backend)))
    return found


def _unsupported(target: str, precision: str, backend: str) -> str | None:
    """Why the target cannot run this cell (the error a build would stop with), or None."""
    try:
        recipes_for(get_target(target), precision, backend)
    except InfoptError as exc:
        return exc.what
    return None
