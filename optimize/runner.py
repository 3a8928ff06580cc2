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


class Runner:
    kind = "runner"
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
        options = ort.SessionOptions()
        options.log_severity_level = 3
        if not optimize:
            options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        if threads:
            options.intra_op_num_threads = threads
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
