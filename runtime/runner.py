"""Runner: one call signature over every way of executing a model. Each backend's runner lives in
``runtime/backends/``; this module holds the base class and eager PyTorch.

``runner.run(feed)`` takes a dict of numpy arrays by input name and returns the outputs as a
list of numpy arrays. ``runner(*arrays)`` is the friendly form: arrays or tensors in input
order, one output returned bare or several as a tuple.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from infopt.core.errors import UsageError
from infopt.runtime.cuda_graphs import GraphedCallable


class Runner:
    kind = "runner"
    device = "cpu"
    input_names: tuple[str, ...] = ()
    output_names: tuple[str, ...] = ()
    clock = None
    """``clock(fn, feed) -> seconds`` where a run must be timed where it runs (a worker process's runner,
    ``runtime/worker.py``); None: the caller's host clock or CUDA events time ``run``"""

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
    """Eager PyTorch: an ``nn.Module`` or ``ScriptModule`` called with tensors in input order, on
    ``device`` (the module must already be there); on CUDA, with ``cuda_graphs``, calls replay CUDA
    graphs per batch bucket (``runtime/cuda_graphs.py``)."""

    kind = "torch-eager"

    def __init__(self, module, input_names: Sequence[str], output_names: Sequence[str] = (), device: str = "cpu",
                 cuda_graphs: bool = False):
        self.module = module
        self.input_names = tuple(input_names)
        self.output_names = tuple(output_names)
        self.device = device
        self.graphs = GraphedCallable(module) if cuda_graphs and device == "cuda" else None

    def run(self, feed: dict[str, np.ndarray]) -> list[np.ndarray]:
        import torch
        from torch.utils._pytree import tree_leaves

        args = [torch.from_numpy(np.ascontiguousarray(feed[n])).to(self.device) for n in self.input_names]
        with torch.inference_mode():
            result = (self.graphs or self.module)(*args)
        return [t.detach().cpu().numpy() for t in tree_leaves(result) if isinstance(t, torch.Tensor)]
