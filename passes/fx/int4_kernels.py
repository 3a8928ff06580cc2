"""Swap the portable INT4 linear op for the Triton W4A16 kernel op on CUDA targets.

``int4_linear(x, qweight, scales, zeros, g_idx, bias, g) -> w4a16_linear(x, qweight, scales, zeros, g_idx, bias, g)``

Both ops take the same arguments and compute ``x @ W.T + bias`` for the packed weight of
:mod:`infopt.quantize.int4_format`; ``w4a16_linear`` runs :mod:`infopt.kernels.w4a16` on CUDA
(the pure-torch reference elsewhere), so the rewrite changes only which kernel computes the node.
A node whose activations are not float16 or bfloat16 keeps the portable op: the kernel would fall
back to the reference for it.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

import infopt.kernels.w4a16  # noqa: F401  (registers infopt::w4a16_linear)
import infopt.quantize.int4_format  # noqa: F401  (registers infopt::int4_linear)
from infopt.core.artifact import Artifact
from infopt.core.registry import Pass, PassContext, PassOptions, PassOutcome
from infopt.passes.fx.graph_utils import finish


class Int4KernelsOptions(PassOptions):
    when: Literal["cuda", "always"] = Field(
        "cuda", description="swap only for a CUDA target, or on any target (the op runs its torch reference off CUDA)")


def check(node) -> str | None:
    """Why ``node`` (an ``infopt.int4_linear`` call) keeps the portable op, or None to swap it."""
    import torch

    value = getattr(node.args[0], "meta", {}).get("val")
    dtype = getattr(value, "dtype", None)
    if dtype is not None and dtype not in (torch.float16, torch.bfloat16):
        return f"its activations are {str(dtype).replace('torch.', '')}; the kernel takes float16 or bfloat16"
    return None


def run(artifact: Artifact, options: Int4KernelsOptions, context: PassContext) -> PassOutcome:
    program = artifact.obj
    device = context.target.device
    if options.when == "cuda" and device != "cuda":
        note = (f"target {context.target.name} runs on {device}: infopt.int4_linear stays the portable op "
                "(the Triton kernel is for CUDA; when='always' swaps anyway)")
        return PassOutcome(artifact.derive("exported", obj=program), False, [note], {"swapped": 0, "kept": 0})

    import torch

    portable = torch.ops.infopt.int4_linear.default
    kernel = torch.ops.infopt.w4a16_linear.default
    swapped, kept, notes = [], [], []
    for node in program.graph.nodes:
        if node.op != "call_function" or node.target != portable:
            continue
        reason = check(node)
        if reason:
            kept.append(node.name)
            notes.append(f"{node.name} kept: {reason}")
            continue
        node.target = kernel
        swapped.append(node.name)
    if swapped:
        finish(program)
    notes.insert(0, f"swapped {len(swapped)} infopt.int4_linear -> infopt.w4a16_linear"
                 if swapped or kept else "no infopt.int4_linear node found")
    details = {"swapped": len(swapped), "kept": len(kept), "swapped_nodes": swapped, "kept_nodes": kept}
    return PassOutcome(artifact.derive("exported", obj=program), bool(swapped), notes, details)


PASS = Pass(
    name="int4_kernels",
    consumes="exported",
    produces="exported",
    run=run,
    options=Int4KernelsOptions,
    description="run INT4 weight-only linears with the Triton W4A16 kernel on CUDA",
    mutates_input=True,
)
