"""Fold an inference BatchNorm into the convolution before it.

``batch_norm(conv(x, W, b)) -> conv(x, W * s, (b - mean) * s + beta)`` with
``s = gamma / sqrt(running_var + eps)`` per output channel (Ioffe & Szegedy 2015, at inference
BN is an affine map and composes with the conv's). The BN's ``bias`` parameter slot carries the
new conv bias, so no placeholder is added; the BN's other state is dropped.
"""

from __future__ import annotations

from pydantic import Field

from infopt.core.artifact import Artifact
from infopt.core.pass_api import Pass, PassContext, PassOptions, PassOutcome
from infopt.passes.fx.graph_utils import drop_unused_state, finish, set_state_tensor, state_target, state_tensor


class FoldBatchNormOptions(PassOptions):
    compute_dtype: str = Field("float64", description="dtype the folded weights are computed in before casting back")


def _ops():
    import torch

    aten = torch.ops.aten
    bns = {aten.batch_norm.default: 5, aten._native_batch_norm_legit_no_training.default: None}
    convs = {aten.conv1d.default, aten.conv2d.default, aten.conv3d.default, aten.convolution.default}
    return bns, convs


def _eps(bn) -> float:
    import torch

    if bn.target == torch.ops.aten.batch_norm.default:
        return float(bn.args[7])
    return float(bn.args[6])


def check(program, bn) -> str | None:
    """Why ``bn`` cannot be folded into its input, or None when it can."""
    import torch

    bns, convs = _ops()
    conv = bn.args[0]
    if getattr(conv, "target", None) not in convs:
        return f"its input {getattr(conv, 'name', conv)} is not a convolution"
    if bns[bn.target] is not None and bn.args[bns[bn.target]]:
        return "batch norm runs in training mode"
    if conv.target == torch.ops.aten.convolution.default and conv.args[6]:
        return "transposed convolution"
    if len(conv.users) != 1:
        return f"the convolution {conv.name} has other users"
    weight, beta, gamma = conv.args[1], bn.args[2], bn.args[1]
    if state_target(program, weight) is None or len(weight.users) != 1:
        return "the convolution weight is not a parameter of its own (shared or computed)"
    if gamma is None or beta is None or state_target(program, beta) is None or len(beta.users) != 1:
        return "batch norm without its own affine parameters"
    for stat in (bn.args[3], bn.args[4], gamma):
        if state_target(program, stat) is None:
            return "batch norm statistics are not stored buffers"
    bias = conv.args[2] if len(conv.args) > 2 else None
    if bias is not None and state_target(program, bias) is None:
        return "the convolution bias is computed, not stored"
    if bn.target != torch.ops.aten.batch_norm.default:
        if any(u.target.__name__ != "getitem" or (u.args[1] != 0 and u.users) for u in bn.users):
            return "batch norm statistics outputs are used"
    return None


def fold(program, bn, compute_dtype) -> None:
    import torch

    conv = bn.args[0]
    weight, bias_node = conv.args[1], conv.args[2] if len(conv.args) > 2 else None
    gamma, beta, mean, var = (state_tensor(program, n).detach().to(compute_dtype) for n in bn.args[1:5])
    w = state_tensor(program, weight).detach().to(compute_dtype)
    b = state_tensor(program, bias_node).detach().to(compute_dtype) if bias_node is not None else torch.zeros_like(mean)
    scale = gamma / torch.sqrt(var + _eps(bn))
    set_state_tensor(program, weight, w * scale.reshape(-1, *([1] * (w.dim() - 1))))
    set_state_tensor(program, bn.args[2], (b - mean) * scale + beta)
    args = list(conv.args) + [None] * max(0, 3 - len(conv.args))
    args[2] = bn.args[2]
    conv.args = tuple(args)
    if bn.target == torch.ops.aten.batch_norm.default:
        bn.replace_all_uses_with(conv)
    else:
        for user in list(bn.users):
            if user.args[1] == 0:
                user.replace_all_uses_with(conv)
            program.graph.erase_node(user)
    program.graph.erase_node(bn)


def run(artifact: Artifact, options: FoldBatchNormOptions, context: PassContext) -> PassOutcome:
    import torch

    program = artifact.obj
    bns, _ = _ops()
    folded, notes = 0, []
    for node in list(program.graph.nodes):
        if node.op != "call_function" or node.target not in bns:
            continue
        reason = check(program, node)
        if reason:
            notes.append(f"{node.name} not folded: {reason}")
            continue
        fold(program, node, getattr(torch, options.compute_dtype))
        folded += 1
    finish(program)
    drop_unused_state(program)
    finish(program)
    notes.insert(0, f"folded {folded} batch norm(s) into convolutions")
    return PassOutcome(artifact.derive("exported", obj=program), folded > 0, notes)


PASS = Pass(
    name="fold_batchnorm",
    consumes="exported",
    produces="exported",
    run=run,
    options=FoldBatchNormOptions,
    description="fold inference BatchNorm into the preceding convolution",
)
