"""Swap the portable INT4 linear op for the Triton W4A16 kernel op on CUDA targets.

``int4_linear(x, qweight, scales, zeros, g_idx, bias, g) -> w4a16_linear(x, qweight', scales, zeros, perm, bias, g)``

Both compute ``x @ W.T + bias``; ``w4a16_linear`` takes the weight in the kernel's layout
(:mod:`infopt.kernels.w4a16_layout`: the same shapes and dtypes, the codes reordered, act-order as a
permutation), so the pass rewrites each swapped node's ``qweight`` (and ``g_idx``) constants once, at
build time, and nothing is converted per call. ``w4a16_linear`` is a ``triton_op``: AOTInductor
compiles its kernel into the package, so the package runs without infopt. A node keeps the portable
op, with the reason in the notes, when its activations are not float16 or bfloat16 (the kernel
would fall back to the reference) or when its weight does not fit the layout (group size not a
power of two of at least 32, uneven act-order groups).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

import infopt.quantize.int4_format  # noqa: F401  (registers infopt::int4_linear)
from infopt.core.artifact import Artifact
from infopt.core.pass_api import Pass, PassContext, PassDetails, PassOptions, PassOutcome
from infopt.kernels import w4a16
from infopt.kernels.w4a16_layout import to_kernel_layout, unsupported
from infopt.passes.fx.graph_utils import finish, lifted_store

QWEIGHT, G_IDX, GROUP_SIZE = 1, 4, 6
"""Positions of the weight, the act-order index and the group size in both ops' arguments."""


class Int4KernelsOptions(PassOptions):
    when: Literal["cuda", "always"] = Field(
        "cuda", description="swap only for a CUDA target, or on any target (the op runs its torch reference off CUDA)")


def check(node) -> str | None:
    """Why ``node`` (an ``infopt.int4_linear`` call) keeps the portable op for its activations, or None."""
    import torch

    value = getattr(node.args[0], "meta", {}).get("val")
    dtype = getattr(value, "dtype", None)
    if dtype is not None and dtype not in (torch.float16, torch.bfloat16):
        return f"its activations are {str(dtype).replace('torch.', '')}; the kernel takes float16 or bfloat16"
    return None


def _weight(program, node):
    """``(qweight store, g_idx store)``: where the node's constants live, each ``(dict, key)`` or None."""
    qweight = lifted_store(program, node.args[QWEIGHT])
    g_idx = node.args[G_IDX]
    return qweight, None if g_idx is None else lifted_store(program, g_idx)


def _layout_problem(program, node, portable) -> str | None:
    """Why the node's weight cannot be put into the kernel layout in place, or None."""
    qweight, g_idx = _weight(program, node)
    if qweight is None or (node.args[G_IDX] is not None and g_idx is None):
        return "its weight is computed in the graph, not stored; the kernel layout is made from a stored weight"
    for position in (QWEIGHT, G_IDX):
        arg = node.args[position]
        if arg is not None and any(user.target != portable or user.args[position] is not arg for user in arg.users):
            return "its packed weight is also read by other nodes, which expect infopt's format"
    store, key = qweight
    index = None if g_idx is None else g_idx[0][g_idx[1]]
    return unsupported(int(store[key].shape[1]) * 2, int(node.args[GROUP_SIZE]), index)


def _to_kernel_layout(program, node, done: set) -> None:
    """Rewrite the node's weight (and act-order index) in place; a weight tied to another node is rewritten once."""
    (store, key), g_idx = _weight(program, node)
    if (id(store), key) in done:
        return
    done.add((id(store), key))
    index = None if g_idx is None else g_idx[0][g_idx[1]]
    packed, perm = to_kernel_layout(store[key], index, int(node.args[GROUP_SIZE]))
    store[key] = packed
    if g_idx is not None:
        g_idx[0][g_idx[1]] = perm


def run(artifact: Artifact, options: Int4KernelsOptions, context: PassContext) -> PassOutcome:
    program = artifact.obj
    device = context.target.device
    if options.when == "cuda" and device != "cuda":
        note = (f"target {context.target.name} runs on {device}: infopt.int4_linear stays the portable op "
                "(the Triton kernel is for CUDA; when='always' swaps anyway)")
        return PassOutcome(artifact.derive("exported", obj=program), False, [note], KernelSwapDetails(swapped=0, kept=0))

    import torch

    portable = torch.ops.infopt.int4_linear.default
    kernel = w4a16.registered().default
    nodes = [n for n in program.graph.nodes if n.op == "call_function" and n.target == portable]
    swapped, kept, notes, done = [], [], [], set()
    for node in nodes:
        reason = check(node) or _layout_problem(program, node, portable)
        if reason:
            kept.append(node.name)
            notes.append(f"{node.name} kept: {reason}")
            continue
        _to_kernel_layout(program, node, done)
        swapped.append(node)
    for node in swapped:
        node.target = kernel
    if swapped:
        finish(program)
    notes.insert(0, f"swapped {len(swapped)} infopt.int4_linear -> infopt.w4a16_linear (weights in the kernel layout)"
                 if swapped or kept else "no infopt.int4_linear node found")
    details = KernelSwapDetails(swapped=len(swapped), kept=len(kept), swapped_nodes=[n.name for n in swapped], kept_nodes=kept)
    return PassOutcome(artifact.derive("exported", obj=program), bool(swapped), notes, details)



class KernelSwapDetails(PassDetails):
    """What ``int4_kernels`` records: the INT4 linears now on the W4A16 kernel, and those kept (why is in the notes)."""

    swapped: int
    kept: int
    swapped_nodes: list[str] = Field(default_factory=list)
    kept_nodes: list[str] = Field(default_factory=list)


PASS = Pass(
    name="int4_kernels",
    consumes="exported",
    produces="exported",
    run=run,
    details=KernelSwapDetails,
    options=Int4KernelsOptions,
    description="run INT4 weight-only linears with the Triton W4A16 kernel on CUDA (weights in its layout)",
)
