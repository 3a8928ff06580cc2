"""TorchScript into a graph torch.export can capture with dynamic dims.

``torch.jit.trace`` records size arithmetic as tensor ops: ``x.shape[1] // heads`` becomes
``NumToTensor(size) -> div -> Int``. ``TS2EPConverter`` turns each such ``Int`` into a
data-dependent (unbacked) integer with runtime assertions taken from the trace's own shapes
(``u1 >= 8``), so the captured model refuses sizes the trace did not see, and AOTInductor
cannot compile some of them at all. :func:`fold_size_arithmetic` rewrites each chain back into
integer arithmetic on the input sizes and drops the converter's assertions; the capture that
follows derives its own guards from the InputSpec's ranges.
"""

from __future__ import annotations

import operator
from typing import Any

FOLDABLE = {
    "aten.mul.Tensor": operator.mul, "aten.mul.Scalar": operator.mul,
    "aten.add.Tensor": operator.add, "aten.add.Scalar": operator.add,
    "aten.sub.Tensor": operator.sub, "aten.sub.Scalar": operator.sub,
    "aten.floor_divide.default": operator.floordiv, "aten.floor_divide.Scalar": operator.floordiv,
}
"""Integer ops on 0-d size tensors and the Python operator on sizes each stands for. Sizes are not
negative, so a division rounded toward zero (``div`` with ``rounding_mode='trunc'``) is a floor."""


def to_graph_module(script_module, args: tuple):
    """The TorchScript module as an ``fx.GraphModule`` with its size arithmetic on integers."""
    from torch._export.converter import TS2EPConverter

    module = TS2EPConverter(script_module, args).convert().module()
    fold_size_arithmetic(module)
    module.recompile()
    return module


def fold_size_arithmetic(module) -> int:
    """Replace each ``_local_scalar_dense`` of a size computed in tensors by the same computation on
    integers; remove the converter's runtime assertions. Returns how many were replaced."""
    graph = module.graph
    replaced = 0
    for node in list(graph.nodes):
        if node.op != "call_function" or str(node.target) != "aten._local_scalar_dense.default":
            continue
        with graph.inserting_before(node):
            value = _integer(node.args[0], module, graph)
        if value is None:
            continue
        for user in list(node.users):
            user.replace_input_with(node, value)
        graph.erase_node(node)
        replaced += 1
    if replaced:
        for node in list(graph.nodes):
            if node.op == "call_function" and str(node.target) in ("aten._assert_scalar.default",
                                                                     "aten.sym_constrain_range_for_size.default"):
                graph.erase_node(node)
    graph.eliminate_dead_code()  # also the integer ops of a chain that turned out not to fold
    return replaced


def _integer(node, module, graph) -> Any:
    """``node``'s value as an int or as a graph node giving a SymInt; None when it is not size arithmetic."""
    import torch

    if isinstance(node, int) and not isinstance(node, bool):
        return node
    if not hasattr(node, "op"):
        return None
    if node.op == "get_attr":
        tensor = operator.attrgetter(node.target)(module)
        if isinstance(tensor, torch.Tensor) and tensor.dim() == 0 and not tensor.is_floating_point():
            return int(tensor.item())
        return None
    if node.op != "call_function":
        return None
    target = str(node.target)
    if target == "aten.sym_size.int":
        return node
    if target == "aten.scalar_tensor.default":
        return _integer(node.args[0], module, graph)
    if target == "aten._to_copy.default":
        dtype = node.kwargs.get("dtype")
        return _integer(node.args[0], module, graph) if dtype is not None and not dtype.is_floating_point else None
    if target in ("aten.div.Tensor_mode", "aten.div.Scalar_mode") and node.kwargs.get("rounding_mode") in ("trunc", "floor"):
        op = operator.floordiv
    elif target in FOLDABLE and node.kwargs.get("alpha", 1) == 1:
        op = FOLDABLE[target]
    else:
        return None
    left, right = (_integer(a, module, graph) for a in node.args[:2])
    if left is None or right is None:
        return None
    if isinstance(left, int) and isinstance(right, int):
        return op(left, right)
    return graph.call_function(op, (left, right))

