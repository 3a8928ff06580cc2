"""Runner: one call signature over every way of executing a model.

``runner.run(feed)`` takes a dict of numpy arrays by input name and returns the outputs as a
list of numpy arrays. ``runner(*arrays)`` is the friendly form: arrays or tensors in input
order, one output returned bare or several as a tuple.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import numpy as np

from infopt.errors import EnvironmentProblem, UsageError
from infopt.threads import ort_session_options


class Runner:
    kind = "runner"
    device = "cpu"
    input_names: tuple[str, ...] = ()
    output_names: tuple[str, ...] = ()

    def run(self, feed: dict[str, np.ndarray]) -> list[np.ndarray]:
        raise NotImplementedError

    def __call__(self, *args: Any, **kwargs: Any):
        feed = dict(zip(self.input_names, args))
        feed.update(kwargs)
        missing = [n for n in self.input_names if n not in feed]
        if missing:
            raise UsageError(f"missing inputs {', '.join(missing)}", fix=f"pass {', '.join(self.input_names)}")
        outs = self.run({k: _to_numpy(v) for k, v in feed.items()})
        return outs[0] if len(outs) == 1 else tuple(outs)


def _to_numpy(value: Any) -> np.ndarray:
    if hasattr(value, "detach"):
        return value.detach().cpu().numpy()
    return np.asarray(value)


class TorchRunner(Runner):
    """Eager PyTorch: an ``nn.Module`` or ``ScriptModule`` called with tensors in input order."""

    kind = "torch-eager"

    def __init__(self, module, input_names: Sequence[str], output_names: Sequence[str] = ()):
        self.module = module
        self.input_names = tuple(input_names)
        self.output_names = tuple(output_names)

    def run(self, feed: dict[str, np.ndarray]) -> list[np.ndarray]:
        import torch
        from torch.utils._pytree import tree_leaves

        args = [torch.from_numpy(np.ascontiguousarray(feed[n])) for n in self.input_names]
        with torch.inference_mode():
            result = self.module(*args)
        return [t.detach().cpu().numpy() for t in tree_leaves(result) if isinstance(t, torch.Tensor)]


class OrtRunner(Runner):
    """An ONNX Runtime session on a file; ``optimize=False`` runs the graph exactly as written."""

    kind = "onnxruntime"

    def __init__(self, path: str | Path, providers: Sequence[str] = ("CPUExecutionProvider",),
                 optimize: bool = True, threads: int = 0):
        try:
            import onnxruntime as ort
        except ImportError as exc:  # pragma: no cover - a core dependency
            raise EnvironmentProblem("onnxruntime is not installed", fix="pip install onnxruntime") from exc
        options = ort_session_options(optimize, threads)
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


class AotiRunner(Runner):
    """An AOTInductor ``.pt2`` package; it runs on the device it was compiled for (CPU or CUDA)."""

    kind = "aoti"

    def __init__(self, path: str | Path, input_names: Sequence[str], output_names: Sequence[str] = ()):
        import torch

        self.path = Path(path)
        self.package = torch._inductor.aoti_load_package(str(path))
        self.device = self.package.get_metadata().get("AOTI_DEVICE_KEY", "cpu")
        if self.device == "cuda" and not torch.cuda.is_available():
            raise EnvironmentProblem(f"{self.path.name} was compiled for CUDA and this machine has no CUDA GPU",
                                     fix="run it on a GPU machine, or build for --target cpu")
        self.input_names = tuple(input_names)
        self.output_names = tuple(output_names)

    def run(self, feed: dict[str, np.ndarray]) -> list[np.ndarray]:
        import torch
        from torch.utils._pytree import tree_leaves

        args = [_canonical(torch.from_numpy(feed[n])).to(self.device) for n in self.input_names]
        with torch.inference_mode():
            result = self.package(*args)
        return [t.detach().cpu().numpy() for t in tree_leaves(result) if isinstance(t, torch.Tensor)]


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


def runner_for_file(path: str | Path, input_names: Sequence[str] = (), output_names: Sequence[str] = (),
                    threads: int = 0) -> Runner:
    """The runner for a model file by its kind: ``.onnx``, ``.pt2`` (AOTInductor) or ``.plan`` (TensorRT)."""
    suffix = Path(path).suffix
    if suffix == ".pt2":
        return AotiRunner(path, input_names, output_names)
    if suffix == ".plan":
        from infopt.tensorrt_runner import TensorRTRunner

        return TensorRTRunner(path)
    return OrtRunner(path, threads=threads)
