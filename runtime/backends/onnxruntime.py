"""The ONNX Runtime backend: ``.onnx`` files run in an ``InferenceSession``."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np

from infopt.core.errors import EnvironmentProblem
from infopt.core.threads import ort_session_options
from infopt.runtime.backend import Backend, check, package_version, register
from infopt.runtime.runner import Runner


class OrtRunner(Runner):
    """An ONNX Runtime session on a file; ``optimize=False`` runs the graph exactly as written.
    ``spinning=False`` stops its threads from spinning between runs: set it where two sessions are timed
    in turn on the same cores, or the idle one's spinning pool slows the other."""

    kind = "onnxruntime"

    def __init__(self, path: str | Path, providers: Sequence[str] = ("CPUExecutionProvider",),
                 optimize: bool = True, threads: int = 0, spinning: bool = True):
        try:
            import onnxruntime as ort
        except ImportError as exc:  # pragma: no cover - a core dependency
            raise EnvironmentProblem("onnxruntime is not installed", fix="pip install onnxruntime") from exc
        options = ort_session_options(optimize, threads)
        if not spinning:
            options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        available = ort.get_available_providers()
        missing = [p for p in providers if p not in available]
        if missing:
            raise EnvironmentProblem(f"ONNX Runtime provider {', '.join(missing)} is not available here",
                                     fix=f"available: {', '.join(available)}; see `infopt doctor`")
        self.path = Path(path)
        self.session = ort.InferenceSession(str(path), options, providers=list(providers))
        self.input_names = tuple(i.name for i in self.session.get_inputs())
        self.output_names = tuple(o.name for o in self.session.get_outputs())

    def run(self, feed: dict[str, np.ndarray]) -> list[np.ndarray]:
        return self.session.run(None, {n: feed[n] for n in self.input_names})


def open_runner(path: Path, input_names: Sequence[str], output_names: Sequence[str], threads: int = 0,
                device: str = "cpu") -> Runner:
    """On a CUDA target, the CUDA execution provider where this onnxruntime has it; else the CPU."""
    if device == "cuda":
        import onnxruntime as ort  # optional heavy dependency: loaded when a model runs

        if "CUDAExecutionProvider" in ort.get_available_providers():
            return OrtRunner(path, providers=("CUDAExecutionProvider", "CPUExecutionProvider"), threads=threads)
    return OrtRunner(path, threads=threads)


def describe(runner: Runner) -> str:
    providers = runner.session.get_providers()
    return f"{'cuda' if 'CUDAExecutionProvider' in providers else 'cpu'} (onnxruntime {providers[0]})"


def checks() -> list[dict]:
    ort_version = package_version("onnxruntime") or package_version("onnxruntime-gpu")
    providers = []
    if ort_version:
        import onnxruntime  # optional heavy dependency: loaded only when the doctor asks

        providers = onnxruntime.get_available_providers()
    found = [check("onnxruntime", ort_version is not None, f"{ort_version}: {', '.join(providers)}" if ort_version
                   else "not installed", "pip install onnxruntime")]
    for provider, fix in (("CUDAExecutionProvider", "pip install onnxruntime-gpu on a CUDA machine"),
                          ("TensorrtExecutionProvider", "pip install onnxruntime-gpu and TensorRT on a CUDA machine")):
        found.append(check(f"ORT {provider}", provider in providers,
                           "available" if provider in providers else "not in this onnxruntime build", fix))
    return found


BACKEND = register(Backend(
    name="onnxruntime", representation="onnx", suffix=".onnx", runner_kind=OrtRunner.kind,
    open_runner=open_runner, describe=describe, checks=checks,
    fenced=lambda device: device != "cpu",  # a GPU execution provider's kernels; the CPU's run in process
))
