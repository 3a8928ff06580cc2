"""The calibration forwards of ``weight_only.calibrate_int4``: each block's inputs, caught once from a forward that
stops at the first block (where the blocks form a chain, :func:`chained`), the hooks that fold each Linear's real
rows into its statistic as a block runs alone on them (:func:`collect_block`), the rounded block's outputs as the
next block's inputs (:func:`block_outputs`), and the model's own forward where the blocks do not chain
(:func:`collect`). A bf16 block runs those forwards in float32 where bf16 is emulated (:func:`float32_where_slow`).
"""

from __future__ import annotations

import torch
from torch import nn

from infopt.core.bf16_compute import cast_values, float32_where_slow


class _Stop(Exception):
    """Raised by the hook at the end of a block: the rest of the forward is not needed."""


def block_inputs(work: nn.Module, block: nn.Module, batches) -> list[tuple[tuple, dict]] | None:
    """Each batch's arguments at the entry of ``block`` (the first of the stack), from one forward that stops
    there; None where the block does not take its hidden states as a tensor first (the forward each block
    needs is then run from the model's input, as before). A KV cache among them is dropped."""
    found: list[tuple[tuple, dict]] = []

    def grab(_module, args, kwargs):
        found.append((args, _arguments(kwargs)))
        raise _Stop

    _run_batches(work, batches, [block.register_forward_pre_hook(grab, with_kwargs=True)])
    if len(found) != len(batches) or not all(args and isinstance(args[0], torch.Tensor) for args, _ in found):
        return None
    return found


def chained(work: nn.Module, blocks: list[nn.Module], batch) -> bool:
    """Whether the blocks form a chain (the batch's first sequence run through the blocks to see): each block takes
    the previous one's output as its hidden states, and every one the same other arguments. Where not (a residual
    added between blocks, alternating attention masks), each block's inputs must come from the model's forward.
    The forward stops after the last block: a large vocabulary's head costs more than the blocks on one sequence."""
    seen: list[dict] = []
    outputs: list = []

    def entered(_module, args, kwargs):
        seen.append({"hidden": args[0] if args else None, "args": args[1:], **_arguments(kwargs)})

    def left(module, _args, out):
        outputs.append(out[0] if isinstance(out, (tuple, list)) else out)
        if module is blocks[-1]:
            raise _Stop

    handles = [h for b in blocks for h in (b.register_forward_pre_hook(entered, with_kwargs=True),
                                           b.register_forward_hook(left))]
    first = batch
    if all(isinstance(t, torch.Tensor) and t.dim() > 0 and t.shape[0] == batch[0].shape[0] for t in batch):
        first = tuple(t[:1] for t in batch)
    _run_batches(work, [first], handles)
    if len(seen) != len(blocks) or len(outputs) != len(blocks):
        return False
    rest = [{k: v for k, v in entry.items() if k != "hidden"} for entry in seen]
    return (all(_equal(rest[0], other) for other in rest[1:])
            and all(_equal(out, entry["hidden"]) for out, entry in zip(outputs, seen[1:])))


def _equal(a, b) -> bool:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    if isinstance(a, (tuple, list)) and isinstance(b, (tuple, list)):
        return len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b))
    return a is b or a == b


CACHE_KWARGS = ("past_key_values", "past_key_value", "layer_past", "cache", "use_cache")
"""a decoder block's arguments for the KV cache, which calibration neither needs nor may grow (a block run twice
on one cache would attend to its own first run's keys)"""


def _arguments(kwargs: dict) -> dict:
    """A block's keyword arguments without its KV cache (by name, or any ``*Cache`` object)."""
    return {k: v for k, v in kwargs.items() if k not in CACHE_KWARGS and not type(v).__name__.endswith("Cache")}


def _statistic_hooks(work: nn.Module, members: list[str], stats: dict, current: dict) -> list:
    """Hooks folding each member's input into its statistic, only the real positions where ``current["mask"]``
    (the batch's ``[batch, seq]`` mask) marks them. Members handed the very same tensor in the first batch (a
    block's query, key and value projections read one normalized input) share one statistic from then on: it is
    folded in once, and ``stats`` maps each of them to the same object."""
    first: dict[str, torch.Tensor] = {}
    owner: dict[str, str] = {}

    def add(_module, args, n):
        x, mask = args[0], current.get("mask")
        if n not in owner:  # the first batch: is this the input another member just read?
            twin = next((m for m, seen in first.items() if seen is x), None)
            owner[n] = twin or n
            first[n] = x
            if twin is not None:
                stats[n] = stats[twin]
        if owner[n] == n:
            stats[n].add(_real_rows(x, mask))

    def output(module, y, n):  # a wide layer's output, toward its statistic's tr(W H W^T) (gptq.Hessian)
        if isinstance(y, torch.Tensor):
            stats[n].add_output(n, _real_rows(y, current.get("mask")), getattr(module, "bias", None))

    hooks = [work.get_submodule(n).register_forward_pre_hook(lambda m, args, n=n: add(m, args, n)) for n in members]
    return hooks + [work.get_submodule(n).register_forward_hook(lambda m, _args, y, n=n: output(m, y, n))
                    for n in members if getattr(stats[n], "wants_outputs", False)]


def _real_rows(x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """``x``'s rows at the positions ``mask`` (``[batch, seq]``) marks real, where it is a ``[batch, seq, ...]``
    tensor of that batch; else ``x``."""
    return x[mask] if mask is not None and x.dim() == 3 and x.shape[:2] == mask.shape else x


def collect_block(work: nn.Module, block: nn.Module, members: list[str], stats: dict, inputs, masks) -> int:
    """The statistics of ``block``'s Linears from the block alone, run on its cached inputs: calibration then
    costs one block per block, not the model's way up to each one."""
    current: dict = {}
    handles = _statistic_hooks(work, members, stats, current)
    try:
        with torch.no_grad(), float32_where_slow(block) as cast:
            for (args, kwargs), mask in zip(inputs, masks):
                current["mask"] = mask
                block(*cast_values(cast, args), **cast_values(cast, kwargs))
    finally:
        for handle in handles:
            handle.remove()
    return stats[members[0]].rows


def block_outputs(block: nn.Module, inputs) -> list[tuple[tuple, dict]]:
    """The next block's inputs: ``block`` (now quantized) run on its own, its hidden states in place of theirs
    (in their own dtype)."""
    found = []
    with torch.no_grad(), float32_where_slow(block) as cast:
        for args, kwargs in inputs:
            out = block(*cast_values(cast, args), **cast_values(cast, kwargs))
            hidden = out[0] if isinstance(out, (tuple, list)) else out
            found.append(((hidden.to(args[0].dtype), *args[1:]), kwargs))
    return found


def collect(work: nn.Module, block: nn.Module | None, members: list[str], stats: dict, batches, masks) -> int:
    """The statistics of ``members`` from the model's own forward on each batch, stopped at the end of ``block``
    (the whole forward for the Linears outside the blocks, ``block`` None); the rows the first member saw."""
    current: dict = {}
    handles = _statistic_hooks(work, members, stats, current)
    if block is not None:
        def stop(_module, _args, _output):
            raise _Stop

        handles.append(block.register_forward_hook(stop))
    _run_batches(work, batches, handles, masks, current)
    return stats[members[0]].rows


def _run_batches(work: nn.Module, batches, handles: list, masks=None, current: dict | None = None) -> None:
    """Every batch through ``work`` (a hook's ``_Stop`` ends one where the rest is not needed), then the hooks off;
    ``current["mask"]`` is each batch's mask while it runs."""
    try:
        with torch.no_grad():
            for index, batch in enumerate(batches):
                if current is not None:
                    current["mask"] = masks[index] if masks is not None else None
                try:
                    work(*batch)
                except _Stop:
                    pass
    finally:
        for handle in handles:
            handle.remove()
