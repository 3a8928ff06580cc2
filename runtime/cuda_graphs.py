"""CUDA graphs per batch-size bucket: a model's launches recorded once per input shape and replayed.

A GPU runner spends host time on every launch of every call; a decoder's layers are each a few
microseconds of GPU work, so the host, not the GPU, sets the pace. A CUDA graph records one call's
launches and replays them with one host call. :class:`GraphedCallable` keeps one graph per input
shape, with the batch (dim 0 of every input) rounded up to a bucket (1, 2, 4, 8, ... up to the
largest batch) so that a handful of graphs serve every batch size: inputs are copied into the
bucket's buffers (the rows past the real batch keep what they held; each output row depends only on
its own input row in an inference model) and the outputs are sliced back. A model whose outputs do
not keep the batch as dim 0 is captured per exact batch instead. Dims other than the batch are not
padded: each new one is a new graph, up to ``max_graphs``; past that, calls run eagerly.

Outputs are views of the graph's own buffers, valid until the next call (runners copy them out).
``capture`` is how a graph is recorded (:func:`cuda_capture` on a GPU); a replacement takes
``(fn, static_inputs)`` and returns ``(replay, static_outputs)``.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Sequence

log = logging.getLogger("infopt.runtime.cuda_graphs")

Capture = Callable[[Callable, list], tuple[Callable[[], None], Any]]


def cuda_capture(fn: Callable, static_inputs: list) -> tuple[Callable[[], None], Any]:
    """Warm ``fn`` up on a side stream (autotuning, lazy initialization), then record one call."""
    import torch

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn(*static_inputs)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outputs = fn(*static_inputs)
    return graph.replay, outputs


def bucket_for(batch: int, largest: int | None) -> int:
    """The next power of two at or above ``batch`` (``largest`` caps it, when ``batch`` fits under it)."""
    bucket = 1 << max(batch - 1, 0).bit_length()
    return min(bucket, largest) if largest is not None and batch <= largest else bucket


def buckets_up_to(largest: int) -> list[int]:
    """The buckets a batch range ``1..largest`` falls into."""
    found = sorted({bucket_for(b, largest) for b in range(1, largest + 1)})
    return found


def _flatten(outputs) -> tuple[list, Callable[[list], Any]]:
    """The tensors in ``outputs`` and how to put a list of them back in its structure."""
    from torch.utils._pytree import tree_flatten, tree_unflatten

    leaves, spec = tree_flatten(outputs)
    return leaves, lambda values: tree_unflatten(values, spec)


class GraphedCallable:
    """``fn(*inputs)`` through CUDA graphs captured per input-shape bucket (see the module docstring)."""

    def __init__(self, fn: Callable, *, largest_batch: int | None = None, max_graphs: int = 16,
                 capture: Capture = cuda_capture, pad_batch: bool = True):
        self.fn = fn
        self.largest_batch = largest_batch
        self.max_graphs = max_graphs
        self.capture = capture
        self.pad_batch = pad_batch
        self.graphs: dict[tuple, tuple[list, Callable[[], None], list, Callable]] = {}
        self.eager_calls = 0
        self.failed: str | None = None
        """why capture failed, after which every call runs eagerly"""

    def _key(self, inputs: Sequence) -> tuple[tuple, int]:
        batch = int(inputs[0].shape[0]) if inputs and inputs[0].dim() else 1
        rows = bucket_for(batch, self.largest_batch) if self.pad_batch else batch
        shapes = tuple((rows, *t.shape[1:]) if t.dim() else () for t in inputs)
        return (shapes, tuple(t.dtype for t in inputs), tuple(str(t.device) for t in inputs)), batch

    def __call__(self, *inputs):
        if self.failed is not None:
            self.eager_calls += 1
            return self.fn(*inputs)
        key, batch = self._key(inputs)
        entry = self.graphs.get(key)
        if entry is None:
            if len(self.graphs) >= self.max_graphs:
                self.eager_calls += 1
                return self.fn(*inputs)
            entry = self._record(key, inputs)
            if entry is None:
                return self(*inputs)
        static_inputs, replay, static_outputs, rebuild = entry
        for buffer, value in zip(static_inputs, inputs):
            if buffer.dim():
                buffer[: value.shape[0]].copy_(value)
            else:
                buffer.copy_(value)
        replay()
        rows = key[0][0][0] if key[0] and key[0][0] else batch
        return rebuild([t[:batch] if rows != batch else t for t in static_outputs])

    def _record(self, key: tuple, inputs: Sequence):
        """Capture a graph for ``key``; None when the model cannot be padded (then retried per exact batch)."""
        import torch

        shapes, dtypes, devices = key
        static_inputs = [torch.zeros(shape, dtype=dtype, device=device) for shape, dtype, device in zip(shapes, dtypes, devices)]
        for buffer, value in zip(static_inputs, inputs):
            if buffer.dim():
                buffer[: value.shape[0]].copy_(value)
            else:
                buffer.copy_(value)
        try:
            replay, outputs = self.capture(self.fn, static_inputs)
        except Exception as exc:  # noqa: BLE001 - a model that cannot be captured still runs, eagerly
            self.failed = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
            log.warning("CUDA graph capture failed, running eagerly from now on: %s", self.failed)
            return None
        leaves, rebuild = _flatten(outputs)
        rows = shapes[0][0] if shapes and shapes[0] else None
        if self.pad_batch and not self.graphs and (rows is None or not self._batch_first(static_inputs, leaves, rows)):
            log.info("outputs do not keep the batch as dim 0: CUDA graphs are captured per exact batch size")
            self.pad_batch = False
            return None
        entry = (static_inputs, replay, leaves, rebuild)
        self.graphs[key] = entry
        return entry

    def _batch_first(self, static_inputs: list, leaves: list, rows: int) -> bool:
        """Whether every output's dim 0 is the batch: one eager call at another batch size tells
        (an output whose dim 0 merely equals the bucket, such as a sum over the batch, would not change)."""
        import torch

        probe_rows = rows - 1 if rows > 1 else 2
        probe = [t if not t.dim() else t[:probe_rows] if rows > 1 else torch.cat([t, t]) for t in static_inputs]
        probed, _ = _flatten(self.fn(*probe))
        return len(probed) == len(leaves) and all(
            o.dim() and g.dim() and o.shape[0] == probe_rows and g.shape[0] == rows and o.shape[1:] == g.shape[1:]
            for o, g in zip(probed, leaves))

    def describe(self) -> str:
        """What the graphs are, for a report line."""
        if self.failed is not None:
            return f"CUDA graphs not used: capture failed ({self.failed})"
        batches = sorted({shapes[0][0] for shapes, _, _ in self.graphs if shapes and shapes[0]})
        how = "per batch bucket" if self.pad_batch else "per exact batch size"
        return f"CUDA graphs captured {how} ({', '.join(map(str, batches)) or 'none yet'}), replayed per call"
