"""How long one call of a model takes: the host clock, or CUDA events for a model on a GPU. ``validators.timing``
builds its protocol on these; a worker process (``runtime/worker.py``) times its runner with them where it runs."""

from __future__ import annotations

import time
from typing import Callable


def host_timer(fn: Callable[[dict], object], feed: dict) -> float:
    """Seconds one call takes on the host clock."""
    start = time.perf_counter()
    fn(feed)
    return time.perf_counter() - start


def cuda_timer(fn: Callable[[dict], object], feed: dict) -> float:
    """Seconds one call takes on the GPU: CUDA events around it, after a synchronize."""
    import torch

    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    fn(feed)
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1e3
