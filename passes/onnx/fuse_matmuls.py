"""Sibling MatMul fusion: MatMuls that read the same activation through constant weights (a
transformer's query, key and value projections) become one MatMul over the concatenated weights,
one bias Add, and a Split back into the original outputs.

The result is exact in FP32, and INT8 sees the same numbers: per-channel weight scales are per
output column, which the concatenation keeps, and the shared activation was already quantized
once with one scale. What changes is the work ONNX Runtime does: one integer GEMM of three times
the width instead of three, one quantization of the activation inside a fused dynamic-INT8 kernel
instead of one per projection. On all-MiniLM-L6-v2 with dynamic INT8 this saves about a tenth of
the run time at batch 1 and 32 (benchmarks/results/int8.md). The fused layer is one layer for the
INT8 fallback, named after the first of its members, its module the members' modules joined.
:func:`fuse_nbits` does the same for ONNX Runtime's 4-bit ``MatMulNBits`` (the text-generation graph's INT4).
"""

from __future__ import annotations

import numpy as np

from infopt.core import onnx_graph
from infopt.core.artifact import Artifact
from infopt.core.onnx_graph import SCOPES, drop_initializers
from infopt.core.pass_api import Pass, PassContext, PassDetails, PassOptions, PassOutcome
from infopt.core.tensor_file import InMemoryTensors
from infopt.passes.onnx.checks import check_for_onnxruntime


def siblings(model) -> list[tuple[list, list]]:
    """Groups of two or more MatMuls on one activation, each with a constant 2-D float weight used by
    no other node and a single consumer that adds a constant 1-D bias (or every member without a bias
    Add): (matmuls, adds or Nones)."""
    graph = model.graph
    inits = {i.name: i for i in graph.initializer}
    consumers = onnx_graph.consumers(graph)
    outputs = {o.name for o in graph.output}

    def bias_add(mm):
        users = consumers.get(mm.output[0], [])
        if len(users) != 1 or users[0].op_type != "Add" or mm.output[0] in outputs:
            return None
        other = [i for i in users[0].input if i != mm.output[0]]
        return users[0] if len(other) == 1 and other[0] in inits and len(inits[other[0]].dims) == 1 else None

    by_input: dict[str, list] = {}
    for node in graph.node:
        weight = inits.get(node.input[1]) if node.op_type == "MatMul" and len(node.input) == 2 else None
        if (weight is not None and weight.data_type == 1 and len(weight.dims) == 2
                and len(consumers[node.input[1]]) == 1):
            by_input.setdefault(node.input[0], []).append(node)
    groups = []
    for mms in by_input.values():
        adds = [bias_add(mm) for mm in mms]
        if len(mms) >= 2 and (all(a is not None for a in adds) or all(a is None for a in adds)):
            groups.append((mms, adds))
    return groups


def fuse(model, tensors: InMemoryTensors | None = None) -> int:
    """Fuse every sibling group of ``model`` (an ``onnx.ModelProto``) in place; returns how many groups. ``tensors``
    reads the weights and writes the packed ones (a :class:`~infopt.core.tensor_file.TensorFile` for a model whose
    tensors stay in their file; by default the model holds them)."""
    from onnx import helper

    tensors = tensors or InMemoryTensors()
    graph = model.graph
    inits = {i.name: i for i in graph.initializer}
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 13)
    replaced: dict[int, list] = {}
    dropped: set[int] = set()
    unused: set[str] = set()
    groups = siblings(model)
    for mms, adds in groups:
        head = mms[0].name
        weights = [tensors.array(inits[mm.input[1]]) for mm in mms]
        widths = [w.shape[1] for w in weights]
        tensors.add(graph, np.concatenate(weights, axis=1), f"{head}_fused_weight")
        del weights
        nodes = [helper.make_node("MatMul", [mms[0].input[0], f"{head}_fused_weight"], [f"{head}_fused_out"], name=f"{head}_fused")]
        scope = onnx_graph.joined_modules([onnx_graph.module_path(mm) for mm in mms])
        if scope:
            nodes[0].metadata_props.add(key=SCOPES, value=str([scope, "matmul"]))
        split_input, outs = nodes[0].output[0], [mm.output[0] for mm in mms]
        if adds[0] is not None:
            biases = [tensors.array(inits[next(i for i in a.input if i in inits)]) for a in adds]
            tensors.add(graph, np.concatenate(biases), f"{head}_fused_bias")
            nodes.append(helper.make_node("Add", [split_input, f"{head}_fused_bias"], [f"{head}_fused_biased"],
                                          name=f"{head}_fused_add"))
            split_input, outs = nodes[-1].output[0], [a.output[0] for a in adds]
        sizes = np.asarray(widths, np.int64)
        if opset >= 13:
            tensors.add(graph, sizes, f"{head}_fused_sizes")
            nodes.append(helper.make_node("Split", [split_input, f"{head}_fused_sizes"], outs, name=f"{head}_fused_split", axis=-1))
        else:
            nodes.append(helper.make_node("Split", [split_input], outs, name=f"{head}_fused_split", axis=-1, split=widths))
        replaced[id(mms[0])] = nodes
        dropped |= {id(n) for n in (*mms, *adds) if n is not None}
        unused |= {mm.input[1] for mm in mms}
        unused |= {next(i for i in add.input if i in inits) for add in adds if add is not None}
    if groups:
        kept = []
        for node in graph.node:
            kept.extend(replaced.get(id(node), [] if id(node) in dropped else [node]))
        del graph.node[:]
        graph.node.extend(kept)
        # an exporter stores equal constants once (every all-zero bias of a fresh model is one
        # initializer): drop the old weights and biases only where no node reads them any more
        unused -= {name for node in kept for name in node.input} | {o.name for o in graph.output}
        drop_initializers(graph, unused)
        del graph.value_info[:]
    return len(groups)


NBITS_ATTRIBUTES = ("K", "bits", "block_size", "accuracy_level")


def fuse_nbits(model, tensors: InMemoryTensors | None = None) -> int:
    """The same for ONNX Runtime's 4-bit ``MatMulNBits``: siblings on one activation with equal ``K``, bits,
    block size and accuracy level, constant weights, scales (zero points, bias) each used by no other node,
    and no act-order ``g_idx``, become one ``MatMulNBits`` over the rows stacked along N (the packed weights,
    scales and zero points are laid out per output row, so stacking them is exact) and a Split. Returns how
    many groups. ``tensors`` as :func:`fuse`'s."""
    from onnx import helper

    tensors = tensors or InMemoryTensors()
    graph = model.graph
    inits = {i.name: i for i in graph.initializer}
    consumers = onnx_graph.consumers(graph)

    def attributes(node) -> dict:
        return {a.name: helper.get_attribute_value(a) for a in node.attribute}

    def fusable(node) -> bool:
        names = [n for n in node.input[1:] if n]
        return (node.op_type == "MatMulNBits" and (len(node.input) < 5 or not node.input[4])
                and all(n in inits and len(consumers[n]) == 1 for n in names))

    by_input: dict[tuple, list] = {}
    for node in graph.node:
        if fusable(node):
            key = (node.input[0], tuple(attributes(node).get(a) for a in NBITS_ATTRIBUTES),
                   tuple(bool(n) for n in list(node.input[3:]) + [""] * (6 - len(node.input))))
            by_input.setdefault(key, []).append(node)
    groups = [nodes for nodes in by_input.values() if len(nodes) >= 2]
    replaced: dict[int, list] = {}
    unused: set[str] = set()
    for nodes in groups:
        head = nodes[0].name or nodes[0].output[0]
        stacked = []
        for slot in range(1, len(nodes[0].input)):
            if not nodes[0].input[slot]:
                stacked.append("")
                continue
            arrays = [tensors.array(inits[n.input[slot]]) for n in nodes]
            # each row of the weights, scales, zero points and bias belongs to one output: stack the rows
            joined = np.concatenate([a.reshape(attributes(n)["N"], -1) for a, n in zip(arrays, nodes)])
            joined = joined.reshape(-1, *arrays[0].shape[1:]) if arrays[0].ndim > 1 else joined.reshape(-1)
            name = f"{head}_fused_{slot}"
            tensors.add(graph, joined, name)
            stacked.append(name)
        sizes = [attributes(n)["N"] for n in nodes]
        fused = helper.make_node("MatMulNBits", [nodes[0].input[0], *stacked], [f"{head}_fused_out"],
                                 name=f"{head}_fused", domain=nodes[0].domain,
                                 **{**attributes(nodes[0]), "N": int(sum(sizes))})
        tensors.add(graph, np.asarray(sizes, np.int64), f"{head}_fused_sizes")
        split = helper.make_node("Split", [fused.output[0], f"{head}_fused_sizes"], [n.output[0] for n in nodes],
                                 name=f"{head}_fused_split", axis=-1)
        replaced[id(nodes[0])] = [fused, split]
        for node in nodes[1:]:
            replaced[id(node)] = []
        unused.update(name for node in nodes for name in node.input[1:] if name)
    if groups:
        drop_initializers(graph, unused)
        kept = []
        for node in graph.node:
            kept.extend(replaced.get(id(node), [node]))
        del graph.node[:]
        graph.node.extend(kept)
    return len(groups)


def run(artifact: Artifact, options: PassOptions, context: PassContext) -> PassOutcome:
    import onnx

    model = onnx.load(str(artifact.path))
    onnx_graph.ensure_node_names(model)
    groups = fuse(model)
    if not groups:
        return PassOutcome(artifact, False, ["no MatMuls share an activation; nothing to fuse"])
    check_for_onnxruntime(model)
    path = onnx_graph.save_model(model, context.workdir / "fused-matmuls.onnx")
    return PassOutcome(artifact.derive("onnx", path=path), True,
                       [f"fused {groups} groups of MatMuls that share an activation (e.g. query/key/value)"],
                       FuseDetails(groups=groups))


class FuseDetails(PassDetails):
    """What ``fuse_matmuls`` records: how many groups of MatMuls sharing an activation became one."""

    groups: int


PASS = Pass(
    name="fuse_matmuls",
    consumes="onnx",
    produces="onnx",
    run=run,
    options=PassOptions,
    details=FuseDetails,
    description="fuse MatMuls that share an activation (query/key/value) into one MatMul and a Split; exact",
)
