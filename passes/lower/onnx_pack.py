"""A stamped decoder's sibling projections packed before its only write (``onnx_ir``, in place).

The query/key/value projections of a layer read one activation, and so do gate/up. ``fuse_decoder`` packs
such siblings into one MatMul (``passes/onnx/fuse_matmuls.py``), and used to do it on the written export: every
packed weight was read back, concatenated and written again, and the rest copied beside it, so a decoder's
weights were written twice (at Qwen2.5-0.5B's float32 shape 3.96 GB written for a 1.98 GB folder, the copy 3.7 s
of a 1.5B build). Here, as :func:`~infopt.passes.lower.onnx_stamp.restore_weights` puts the module's tensors back,
each group becomes the MatMul over one weight that is computed when the file is written: the members' weights,
each read from the module as its ``Transpose`` would, copied side by side into the packed ``[in, out]`` layout
(one copy, what folding the transposes alone costs). Then a bias Add over the joined biases where every member has
one, and a Split back into the members' outputs, which is what ``fuse_decoder`` makes and expects
(``passes/decoder/plumbing.py`` feeds the split's input to the attention op as packed QKV).

Exact: each output column is computed from the same weights and bias as before.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from infopt.core.onnx_graph import SCOPES, joined_modules, scoped_module


@dataclass
class _Member:
    matmul: Any
    transpose: Any
    weight: Any
    """the module's weight, ``[out, in]``: the Transpose's input"""
    add: Any = None
    bias: Any = None

    @property
    def output(self):
        return (self.add or self.matmul).outputs[0]


def pack_projections(graph) -> int:
    """Pack every group of two or more MatMuls on one activation whose weights are single-use ``Transpose``\\ s of
    2-D initializers of one dtype and width, each with a 1-D initializer bias of one dtype added (or none of them),
    none of them writing a graph output, in place; returns how many groups."""
    groups: dict[Any, list[_Member]] = {}
    outputs = set(graph.outputs)
    for node in graph:
        member = _member(node, outputs)
        if member is not None:
            groups.setdefault(node.inputs[0], []).append(member)
    packed = 0
    for members in groups.values():
        weights = [m.weight.const_value for m in members]
        if (len(members) < 2 or len({w.dtype for w in weights}) != 1 or len({w.shape[1] for w in weights}) != 1
                or len({m.bias.const_value.dtype if m.bias is not None else None for m in members}) != 1):
            continue
        _pack(graph, members)
        packed += 1
    return packed


def _member(node, outputs) -> _Member | None:
    if node.op_type != "MatMul" or node.domain != "" or len(node.inputs) != 2 or node.inputs[0] is None:
        return None
    transposed = node.inputs[1]
    transpose = transposed.producer() if transposed is not None else None
    if (transpose is None or transpose.op_type != "Transpose" or transpose.domain != "" or len(transposed.uses()) != 1
            or _perm(transpose) not in (None, [1, 0])):
        return None
    weight = transpose.inputs[0]
    if (weight is None or not weight.is_initializer() or weight.const_value is None or len(weight.uses()) != 1
            or len(weight.const_value.shape) != 2 or not weight.const_value.dtype.is_floating_point()):
        return None
    member = _Member(node, transpose, weight)
    out = node.outputs[0]
    users = out.uses()
    if out not in outputs and len(users) == 1 and users[0][0].op_type == "Add" and users[0][0].domain == "":
        add = users[0][0]
        bias = next((v for v in add.inputs if v is not out), None)
        if (bias is not None and bias.is_initializer() and bias.const_value is not None and len(bias.uses()) == 1
                and len(bias.const_value.shape) == 1):
            member.add, member.bias = add, bias
    return None if member.output in outputs else member  # a graph output keeps its node


def _perm(node):
    return list(node.attributes["perm"].as_ints()) if "perm" in node.attributes else None


def _pack(graph, members: list[_Member]) -> None:
    import numpy as np
    import onnx_ir as ir

    head = members[0].matmul
    name = f"{head.name or members[0].weight.name}_packed"
    weights = [m.weight.const_value for m in members]
    widths = [w.shape[0] for w in weights]
    shape = ir.Shape([weights[0].shape[1], sum(widths)])
    dtype = weights[0].dtype
    packed = ir.Value(name=f"{name}_weight", shape=shape, type=ir.TensorType(dtype),
                      const_value=ir.LazyTensor(_side_by_side(weights), dtype=dtype, shape=shape))
    graph.register_initializer(packed)
    scope = joined_modules([scoped_module(m.matmul.metadata_props.get(SCOPES, "")) for m in members])
    nodes = [ir.Node("", "MatMul", [head.inputs[0], packed], name=name,
                     metadata_props={SCOPES: str([scope, "matmul"])} if scope else None)]
    if members[0].bias is not None:
        joined = np.concatenate([m.bias.const_value.numpy() for m in members])
        bias = ir.Value(name=f"{name}_bias", shape=ir.Shape(joined.shape),
                        type=ir.TensorType(members[0].bias.const_value.dtype),
                        const_value=ir.tensor(joined))
        graph.register_initializer(bias)
        nodes.append(ir.Node("", "Add", [nodes[0].outputs[0], bias], name=f"{name}_add"))
    sizes = ir.Value(name=f"{name}_sizes", shape=ir.Shape([len(widths)]), type=ir.TensorType(ir.DataType.INT64),
                     const_value=ir.tensor(np.asarray(widths, np.int64)))
    graph.register_initializer(sizes)
    split = ir.Node("", "Split", [nodes[-1].outputs[0], sizes], attributes=[ir.AttrInt64("axis", -1)],
                    num_outputs=len(members), name=f"{name}_split")
    graph.insert_before(head, [*nodes, split])  # the first member: every member's reader comes after it
    for member, new in zip(members, split.outputs):
        old = member.output
        new.shape, new.type = old.shape, old.type
        old_name, old.name = old.name, None
        old.replace_all_uses_with(new)
        new.name = old_name
    for member in members:
        graph.remove([n for n in (member.add, member.matmul, member.transpose) if n is not None], safe=False)
        for value in (member.weight, member.bias):
            if value is not None:
                graph.initializers.pop(value.name)


def _side_by_side(weights):
    """The members' ``[out, in]`` weights as one ``[in, sum of outs]``, computed when the file is written: each
    transposed into its columns by torch (a blocked copy on every thread), or numpy for a dtype torch has no array
    of."""
    def compute():
        import numpy as np
        import onnx_ir as ir
        import torch

        arrays = [w.numpy() for w in weights]
        try:
            columns = [torch.from_numpy(a) for a in arrays]
        except TypeError:  # bfloat16 and the float8s: numpy (ml_dtypes)
            return ir.tensor(np.ascontiguousarray(np.concatenate(arrays).T))
        out = torch.empty((arrays[0].shape[1], sum(a.shape[0] for a in arrays)), dtype=columns[0].dtype)
        start = 0
        for column in columns:
            out[:, start:start + column.shape[0]].copy_(column.t())
            start += column.shape[0]
        return ir.tensor(out.numpy())
    return compute
