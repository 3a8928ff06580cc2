"""bf16 weights computed in float32 where the CPU emulates bf16 products (an x86 CPU without AVX512-BF16 or AMX:
a bf16 matrix product is several times slower there than a float32 one, :func:`~infopt.core.cpu_features.bf16_products_fast`).

One block at a time (a decoder layer, the head), so a float32 copy of the whole model is never held: a block's bf16
tensors are set aside as it starts, a float32 copy computes (in memory reused block after block), and the same tensors
come back as it ends (a copy back would turn a checkpoint's mapped pages into the process's own memory). The block's
floating inputs are cast up, its outputs back to their dtype, so what flows between blocks keeps the model's own dtype.
torch is imported where it is used: the judging's process imports the validators, which use this, without torch.
"""

from __future__ import annotations

from contextlib import ExitStack, contextmanager
from itertools import chain
from typing import TYPE_CHECKING, Any, Callable, Iterator

from infopt.core.cpu_features import bf16_products_fast

if TYPE_CHECKING:
    import torch
    from torch import nn


def _identity(value: Any) -> Any:
    return value


def _to_float32(value: Any) -> Any:
    import torch

    return value.float() if isinstance(value, torch.Tensor) and value.dtype == torch.bfloat16 else value


def _bf16_tensors(block: nn.Module) -> list[torch.Tensor]:
    import torch

    return [t for t in chain(block.parameters(), block.buffers()) if t.dtype == torch.bfloat16]


@contextmanager
def float32_where_slow(block: nn.Module, workspace: torch.Tensor | None = None) -> Iterator[Callable[[Any], Any]]:
    """``block``'s bf16 parameters and buffers held in float32 for the context where bf16 products are emulated;
    yields the cast for the block's floating inputs (the identity elsewhere). Its float32 buffers are left alone.
    ``workspace``: a flat float32 tensor of at least the block's bf16 elements that the float32 copies are written
    into, for a caller that runs block after block many times (fresh memory's first touch cost most of each cast)."""
    held = _bf16_tensors(block)
    if not held or bf16_products_fast(held[0].device.type):
        yield _identity
        return
    stored = [tensor.data for tensor in held]
    start = 0
    for tensor in held:
        if workspace is None:
            tensor.data = tensor.data.float()
        else:
            tensor.data = workspace[start:start + tensor.numel()].view(tensor.shape).copy_(tensor.data)
            start += tensor.numel()
    try:
        yield _to_float32
    finally:  # the stored tensors themselves, not a copy: a checkpoint's mapped pages stay its pages
        for tensor, values in zip(held, stored):
            tensor.data = values


def cast_values(cast: Callable[[Any], Any], values):
    """``values`` (a tuple of arguments or a dict of keyword arguments) with ``cast`` applied to each, and to each
    item of a tuple among them (a decoder's rotary ``(cos, sin)``)."""
    def one(value):
        return tuple(cast(v) for v in value) if isinstance(value, tuple) else cast(value)

    return {k: one(v) for k, v in values.items()} if isinstance(values, dict) else tuple(one(v) for v in values)


def blocks_of(model: nn.Module) -> list[nn.Module]:
    """The blocks a forward runs one after another: the largest ``ModuleList``'s members (a decoder's layers) and
    the output head where the model has one."""
    from torch import nn

    lists = [m for m in model.modules() if isinstance(m, nn.ModuleList)]
    largest = max(lists, key=lambda m: sum(p.numel() for p in m.parameters()), default=None)
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    return [*(largest or []), *([head] if isinstance(head, nn.Module) else [])]


@contextmanager
def float32_blocks(model: nn.Module) -> Iterator[None]:
    """Each of :func:`blocks_of` ``model`` computed in float32 while it runs (:func:`float32_where_slow`), through
    hooks: nothing changes where bf16 products are fast or the model holds no bf16 weights."""
    import torch

    held = next((t for t in model.parameters() if t.dtype == torch.bfloat16), None)
    if held is None or bf16_products_fast(held.device.type):
        yield
        return
    running: dict[int, tuple[ExitStack, torch.dtype | None]] = {}
    blocks = blocks_of(model)
    # one float32 copy of the largest block, reused: a cast into fresh memory took 34 ms for an 8,960 x 1,536 bf16
    # weight on a 2-core AVX2 CPU, a copy into memory written before 6 ms (benchmarks/results/rules.md)
    workspace = torch.empty(max((sum(t.numel() for t in _bf16_tensors(b)) for b in blocks), default=0),
                            dtype=torch.float32, device=held.device)

    def enter(module, args, kwargs):
        first = next((v for v in chain(args, kwargs.values()) if isinstance(v, torch.Tensor) and v.is_floating_point()),
                     None)
        stack = ExitStack()
        cast = stack.enter_context(float32_where_slow(module, workspace))
        running[id(module)] = (stack, None if first is None else first.dtype)
        return cast_values(cast, args), cast_values(cast, kwargs)

    def leave(module, args, kwargs, output):
        stack, dtype = running.pop(id(module))
        stack.close()
        if dtype is None:
            return output
        back = lambda v: v.to(dtype) if isinstance(v, torch.Tensor) and v.dtype == torch.float32 else v  # noqa: E731
        return tuple(back(v) for v in output) if isinstance(output, tuple) else back(output)

    handles = []
    try:
        for block in blocks:
            handles.append(block.register_forward_pre_hook(enter, with_kwargs=True))
            handles.append(block.register_forward_hook(leave, with_kwargs=True, always_call=True))
        yield
    finally:
        for handle in handles:
            handle.remove()
