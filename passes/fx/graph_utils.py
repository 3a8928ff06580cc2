"""Helpers shared by the ExportedProgram passes: lifted-state lookup and clean-up."""

from __future__ import annotations

from typing import Any


def state_target(program, node) -> str | None:
    """The state_dict key behind a placeholder for a parameter or buffer, else None."""
    if node is None or getattr(node, "op", None) != "placeholder":
        return None
    sig = program.graph_signature
    return sig.inputs_to_parameters.get(node.name) or sig.inputs_to_buffers.get(node.name)


def state_tensor(program, node) -> Any:
    target = state_target(program, node)
    return None if target is None else program.state_dict[target]


def set_state_tensor(program, node, value) -> None:
    """Replace a parameter or buffer with a new tensor (never in place: the eager model shares them)."""
    import torch

    target = state_target(program, node)
    old = program.state_dict[target]
    value = value.to(old.dtype).contiguous()
    program.state_dict[target] = torch.nn.Parameter(value, requires_grad=False) if isinstance(old, torch.nn.Parameter) else value


def lifted_store(program, node) -> tuple[dict, str] | None:
    """The dict and key holding the tensor behind a placeholder: a parameter or buffer in
    ``state_dict``, or a lifted tensor constant in ``constants``; None for a user input."""
    target = state_target(program, node)
    if target is not None:
        return program.state_dict, target
    if getattr(node, "op", None) == "placeholder":
        constant = program.graph_signature.inputs_to_lifted_tensor_constants.get(node.name)
        if constant is not None:
            return program.constants, constant
    return None


def drop_unused_state(program) -> int:
    """Remove parameter and buffer placeholders that no node uses any more; returns how many."""
    sig = program.graph_signature
    lifted = {**sig.inputs_to_parameters, **sig.inputs_to_buffers}
    dropped = 0
    for node in list(program.graph.nodes):
        if node.op == "placeholder" and not node.users and node.name in lifted:
            spec = next(s for s in sig.input_specs if s.arg.name == node.name)
            sig.input_specs.remove(spec)
            if not any(s.target == spec.target for s in sig.input_specs):
                program.state_dict.pop(spec.target, None)
            program.graph.erase_node(node)
            dropped += 1
    return dropped


def finish(program) -> None:
    program.graph.eliminate_dead_code()
    program.graph.lint()
    program.graph_module.recompile()
