"""A cheaper way to launch a Triton kernel again: remember the compiled kernel a call got, and launch
it directly the next time the same specialization comes.

A plain ``kernel[grid](...)`` binds the arguments, works out their specialization (16-byte aligned
pointers, integers equal to 1 or divisible by 16), looks up the autotuner's choice and the compiled
kernel, and only then launches: tens of microseconds of host time per call on a server CPU
(measured in ``benchmarks/bench_w4a16.py``), more than the kernel itself takes on a decoding-sized
layer. :class:`Relauncher` does that work on the first call for a key and, on later calls with the
same key, launches the remembered kernel with the arguments in signature order.

The key is the caller's (the autotuner's key and flags) plus :func:`specialization` of every
argument Triton specializes on, so a kernel compiled for aligned pointers is never launched on
unaligned ones. Where Triton's compiled-kernel API is not what this expects, the first failing
direct launch turns the shortcut off and every call goes through Triton's own path.
"""

from __future__ import annotations

from typing import Any, Callable

import torch


def specialization(values) -> tuple:
    """What Triton's launcher specializes a compiled kernel on, for each of ``values``: a tensor's
    dtype and 16-byte alignment; an integer's being 1, divisible by 16, and fitting 32 bits."""
    found = []
    for value in values:
        if isinstance(value, torch.Tensor):
            found.append((value.dtype, value.data_ptr() & 15 == 0))
        elif isinstance(value, bool) or value is None:
            found.append(value)
        elif isinstance(value, int):
            found.append((value == 1, value & 15 == 0, -(1 << 31) <= value < (1 << 31)))
        else:
            found.append(type(value))
    return tuple(found)


class Relauncher:
    """Launch ``kernel`` (a ``triton.jit`` function, or an autotuner around one) with its leading
    arguments by position and its constexpr flags by name; repeat launches under the same key skip
    Triton's binding and the autotuner's lookup."""

    def __init__(self, kernel):
        self.kernel = kernel
        jit = kernel
        while hasattr(jit, "configs") or not hasattr(jit, "arg_names"):
            jit = jit.fn
        self.arg_names: list[str] = list(jit.arg_names)
        self.cache: dict[Any, tuple] = {}
        self.enabled = True

    def __call__(self, key, grid: Callable[[dict], tuple], args: list, flags: dict) -> None:
        """Launch over ``grid(meta)`` (``meta``: the chosen config's values, e.g. ``BLOCK_N``).
        ``key`` must tell apart every launch that could compile or tune differently: the flags, the
        autotuner's key, and :func:`specialization` of ``args``."""
        hit = self.cache.get(key) if self.enabled else None
        if hit is not None:
            compiled, meta, tail = hit
            dims = grid(meta)
            try:
                compiled[(*dims, 1, 1)[:3]](*args, *tail)
                return
            except Exception:  # noqa: BLE001 - an unexpected Triton API: use Triton's own path from now on
                self.enabled = False
                self.cache.clear()
        compiled = self.kernel[grid](*args, **flags)
        if not self.enabled or not hasattr(compiled, "__getitem__"):
            return
        config = getattr(self.kernel, "best_config", None)
        meta = dict(flags, **(config.kwargs if config is not None else {}))
        rest = self.arg_names[len(args):]
        if all(name in meta for name in rest):
            self.cache[key] = (compiled, meta, [meta[name] for name in rest])
