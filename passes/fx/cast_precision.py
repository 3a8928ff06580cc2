"""Compute in fp16 or bf16 while the model's inputs and outputs stay as they were.

The captured program's module is copied, its floating-point weights and buffers are cast to the
precision, and it is wrapped so floating inputs are cast on the way in and floating outputs are
cast back to their original dtype on the way out; then it is captured again with the same
dynamic dims. Callers keep feeding float32 and reading float32, so drift is measured against the
fp32 reference exactly as for any other candidate, and a server config needs no change.
"""

from __future__ import annotations

import copy
from typing import Literal

from pydantic import Field

from infopt.core.artifact import Artifact
from infopt.core.pass_api import Pass, PassContext, PassDetails, PassOptions, PassOutcome
from infopt.exporters.torch_export import export_module

DTYPES = {"fp16": "float16", "bf16": "bfloat16"}


class CastOptions(PassOptions):
    precision: Literal["fp16", "bf16"] = Field("fp16", description="the dtype the model computes in")
    when: Literal["always", "cuda"] = Field("always", description="cast on every target, or only for a CUDA target")


def retarget_float32(module, dtype) -> None:
    """Make a captured graph's float32 constants ``dtype``, in place.

    Capture records the dtype each tensor had when it was traced, so a graph traced in float32
    makes its own tensors in float32 whatever it is later fed: an LSTM's zero initial state
    (``aten.zeros(..., dtype=torch.float32)``), ``x.to(x.dtype)``, a ``new_zeros``. Cast weights
    then meet float32 activations in one matmul and the compiled model fails at run time. Every
    float32 dtype argument of every graph node becomes ``dtype``, as if the model had been traced
    in it; the drift check measures what that costs. The first capture's tensor-metadata checks
    (``aten._assert_tensor_metadata``, which torch.export records where the model converts dtypes)
    are dropped: a tensor the model makes in float32 by name (DeBERTa-v2's attention scale) is not
    retargeted, and re-capture records checks of its own. float32's own limits as constants (a mask
    filled with ``torch.finfo(torch.float32).min``, as DeBERTa-v2 does) become ``dtype``'s, which it
    can hold. A plain module (no graph) is left as it is.
    """
    import torch

    metadata_check = torch.ops.aten._assert_tensor_metadata.default
    limits = {float(torch.finfo(torch.float32).min): float(torch.finfo(dtype).min),
              float(torch.finfo(torch.float32).max): float(torch.finfo(dtype).max)}

    def retarget(value):
        if value is torch.float32:
            return dtype
        return limits.get(value, value) if isinstance(value, float) else value

    for graph_module in module.modules():
        if not isinstance(graph_module, torch.fx.GraphModule):
            continue
        for node in list(graph_module.graph.nodes):
            if node.op != "call_function":
                continue
            if node.target is metadata_check and not node.users:
                graph_module.graph.erase_node(node)  # the first capture's dtype check, which the cast makes untrue
                continue
            node.args = tuple(retarget(a) for a in node.args)
            node.kwargs = {k: retarget(v) for k, v in node.kwargs.items()}
        graph_module.recompile()


def cast_module(module, dtype):
    """``module`` computing in ``dtype``, with floating inputs and outputs in their own dtypes."""
    import torch
    from torch.utils._pytree import tree_map

    class ComputeIn(torch.nn.Module):
        def __init__(self, inner: torch.nn.Module):
            super().__init__()
            self.inner = copy.deepcopy(inner).to(dtype)
            retarget_float32(self.inner, dtype)

        def forward(self, *args):
            in_dtype = next((a.dtype for a in args if a.is_floating_point()), torch.float32)
            cast = [a.to(dtype) if a.is_floating_point() else a for a in args]
            out = self.inner(*cast)
            return tree_map(lambda t: t.to(in_dtype) if isinstance(t, torch.Tensor) and t.is_floating_point() else t, out)

    return ComputeIn(module).eval()


def run(artifact: Artifact, options: CastOptions, context: PassContext) -> PassOutcome:
    import torch

    if options.when == "cuda" and context.target.device != "cuda":
        note = f"kept float32: the cast is for CUDA targets and {context.target.name} is {context.target.device}"
        return PassOutcome(artifact, False, [note], CastDetails(precision="fp32"))
    dtype = getattr(torch, DTYPES[options.precision])
    wrapped = cast_module(artifact.obj.module(), dtype)
    program = export_module(wrapped, artifact.spec)
    # TorchScript and .pt2 sources hold their weights as buffers, modules as parameters
    cast = sum(1 for t in (*wrapped.parameters(), *wrapped.buffers()) if t.dtype == dtype)
    notes = [f"{cast} weight tensors in {DTYPES[options.precision]}; inputs and outputs keep their dtypes"]
    return PassOutcome(artifact.derive("exported", obj=program), True, notes, CastDetails(precision=options.precision))


class CastDetails(PassDetails):
    """What ``cast_precision`` records: the precision the model computes in after it."""

    precision: str


PASS = Pass(
    name="cast_precision",
    consumes="exported",
    produces="exported",
    run=run,
    details=CastDetails,
    options=CastOptions,
    description="compute in fp16/bf16 with the model's input and output dtypes unchanged",
)
