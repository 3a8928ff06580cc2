"""The Inductor backend: an AOTInductor ``.pt2`` package, compiled for the CPU or a CUDA GPU."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np

from infopt.core.errors import EnvironmentProblem
from infopt.runtime.backend import Backend, check, register
from infopt.runtime.cpp_compiler import candidates, package_compiler
from infopt.runtime.cuda_graphs import GraphedCallable
from infopt.runtime.runner import Runner


class AotiRunner(Runner):
    """An AOTInductor ``.pt2`` package; it runs on the device it was compiled for (CPU or CUDA). On
    CUDA its calls replay CUDA graphs per batch bucket unless ``cuda_graphs=False``."""

    kind = "aoti"

    def __init__(self, path: str | Path, input_names: Sequence[str], output_names: Sequence[str] = (),
                 cuda_graphs: bool | None = None):
        import torch

        self.path = Path(path)
        self.package = LoadedPackage(torch._C._aoti.AOTIModelPackageLoader(str(path), "model", False, 1, -1))
        self.device = self.package.get_metadata().get("AOTI_DEVICE_KEY", "cpu")
        if self.device == "cuda" and not torch.cuda.is_available():
            raise EnvironmentProblem(f"{self.path.name} was compiled for CUDA and this machine has no CUDA GPU",
                                     fix="run it on a GPU machine, or build for --target cpu")
        self.input_names = tuple(input_names)
        self.output_names = tuple(output_names)
        self.graphs = GraphedCallable(self.package) if self.device == "cuda" and cuda_graphs is not False else None

    def run(self, feed: dict[str, np.ndarray]) -> list[np.ndarray]:
        import torch
        from torch.utils._pytree import tree_leaves

        args = [_canonical(torch.from_numpy(feed[n])).to(self.device) for n in self.input_names]
        with torch.inference_mode():
            result = (self.graphs or self.package)(*args)
        return [t.detach().cpu().numpy() for t in tree_leaves(result) if isinstance(t, torch.Tensor)]


class LoadedPackage:
    """A package opened with torch's C++ loader itself, called with its inputs in order and answering its outputs as
    a flat list: what ``torch._inductor.aoti_load_package`` returns, without importing Inductor (about 1 s and 150 MB
    in a worker process, measured here) or reading the archive in Python first."""

    def __init__(self, loader):
        self.loader = loader

    def __call__(self, *tensors):
        return self.loader.boxed_run(list(tensors))

    def get_metadata(self) -> dict[str, str]:
        return self.loader.get_metadata()


def _canonical(tensor):
    """``tensor`` with row-major strides on every dim. An AOTInductor package indexes its inputs by
    their strides; numpy (and ``Tensor.contiguous``) leave any stride on a size-1 dim of a view they
    call contiguous, and with such an input (torch 2.13) the package returns wrong numbers."""
    import torch

    expected, step = [], 1
    for size in reversed(tensor.shape):
        expected.append(step)
        step *= size
    if tuple(reversed(expected)) == tensor.stride():
        return tensor
    return tensor.clone(memory_format=torch.contiguous_format)


def open_runner(path: Path, input_names: Sequence[str], output_names: Sequence[str], threads: int = 0,
                device: str = "cpu", cuda_graphs: bool | None = None) -> Runner:
    """The package runs on the device it was compiled for; ``threads`` and ``device`` do not apply."""
    return AotiRunner(path, input_names, output_names, cuda_graphs=cuda_graphs)


def describe(runner: AotiRunner) -> str:
    graphs = f"; {runner.graphs.describe()}" if runner.graphs is not None else ""
    return f"{runner.device} (AOTInductor package{graphs})"


def cpp_compiler() -> str | None:
    """The first C++ compiler on PATH in Inductor's order (``$CXX``, g++, c++, clang++), or None; not probed."""
    found = candidates()
    return found[0] if found else None


def checks() -> list[dict]:
    """The compiler AOTInductor packages would be built with, probed (``runtime/cpp_compiler.py``)."""
    choice = package_compiler()
    found = (choice.note() or choice.path) if choice.path else choice.problem()
    return [check("C++ compiler (AOTInductor)", choice.path is not None, found,
                  "install the system g++ (apt install g++), or set CXX to a compiler that links libstdc++ "
                  "dynamically; --backend inductor needs one")]


def unavailable(precision: str, device: str) -> str | None:
    if device == "cpu" and cpp_compiler() is None:
        return "AOTInductor needs a C++ compiler for CPU kernels and none is on PATH (install g++ or set CXX)"
    if device == "cuda":
        import torch  # optional heavy dependency: loaded only to ask for a GPU

        if not torch.cuda.is_available():
            return "Inductor compiles CUDA kernels only on a machine with a CUDA GPU, and this one has none"
    return None


BACKEND = register(Backend(
    name="inductor", representation="aoti", suffix=".pt2", runner_kind=AotiRunner.kind,
    open_runner=open_runner, unavailable=unavailable, describe=describe, graphs=True, checks=checks,
    # loading a package, a CPU one too, has ended the process with SIGSEGV (benchmarks/results/rules.md)
    fenced=lambda device: True, worker_imports=("torch",),
))
