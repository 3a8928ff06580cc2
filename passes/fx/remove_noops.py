"""Remove ops that do nothing at inference: eval-mode dropout, identity, clone, alias, detach.

``dropout(x, p, train=False) -> x``; ``clone(x) -> x``; ``alias(x) -> x``; ``detach(x) -> x``.
``nn.Identity`` leaves no op of its own in a captured graph; the copies it and similar code
leave behind (clone, alias) are what this pass removes.
"""

from __future__ import annotations

from pydantic import Field

from infopt.core.artifact import Artifact
from infopt.core.pass_api import Pass, PassContext, PassOptions, PassOutcome
from infopt.passes.fx.graph_utils import drop_unused_state, finish


class RemoveNoopsOptions(PassOptions):
    keep_clones: bool = Field(False, description="keep clone/alias/detach ops (remove dropout only)")


def _noop_reason(node, keep_clones: bool) -> str | None:
    """Why ``node`` can be removed, or None if it must stay."""
    import torch

    aten = torch.ops.aten
    dropouts = {aten.dropout.default, aten.feature_dropout.default, aten.alpha_dropout.default,
                aten.feature_alpha_dropout.default}
    copies = {aten.clone.default, aten.alias.default, aten.detach.default}
    if node.op != "call_function":
        return None
    if node.target in dropouts:
        train = node.args[2] if len(node.args) > 2 else node.kwargs.get("train", False)
        return None if train else "dropout in eval mode"
    if node.target in copies and not keep_clones:
        for user in node.users:
            schema = getattr(user.target, "_schema", None)
            if schema is not None and schema.is_mutable:
                return None
        if node.kwargs.get("memory_format") not in (None,):
            return None
        return f"{node.target.__name__.split('.')[0]} is an identity"
    return None


def run(artifact: Artifact, options: RemoveNoopsOptions, context: PassContext) -> PassOutcome:
    program = artifact.obj
    removed: dict[str, int] = {}
    for node in list(program.graph.nodes):
        reason = _noop_reason(node, options.keep_clones)
        if reason is None:
            continue
        node.replace_all_uses_with(node.args[0])
        program.graph.erase_node(node)
        key = str(node.target).replace("aten.", "").split(".")[0]
        removed[key] = removed.get(key, 0) + 1
    finish(program)
    drop_unused_state(program)
    finish(program)
    notes = [f"removed {n} {op}" for op, n in sorted(removed.items())] or ["no no-op found"]
    return PassOutcome(artifact.derive("exported", obj=program), bool(removed), notes)


PASS = Pass(
    name="remove_noops",
    consumes="exported",
    produces="exported",
    run=run,
    options=RemoveNoopsOptions,
    description="remove eval-mode dropout and identity copies",
)
