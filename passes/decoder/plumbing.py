"""The plumbing between a decoder's projections and its attention op, in the exported text-generation graph.

Exported, a decoder's attention plumbing views each projection's output as heads and back again
(``[B, S, H*D] -> [B, S, H, D] -> [B, S, H*D]``) on its way into ``GroupQueryAttention``, and the
attention's output the same way into the output projection. ONNX Runtime runs each Reshape, Split and
Transpose as its own kernel call, which for a decode step of a small model costs more than the views
themselves. Two rewrites, after the query/key/value projections are packed into one MatMul and a Split
(``fuse_matmuls.py``):

- :func:`collapse_reshapes`: ``Reshape(Reshape(x, a), b)`` becomes ``Reshape(x, b)`` (once the transposes
  between them cancel, two Reshapes in a row remain; the second alone gives the same tensor, a reshape
  keeping the elements' order). This is exact unless the second shape holds a 0, which copies a dimension
  of its own input (the first Reshape's output, not ``x``); so it is made only where the second shape is
  built from constants without a 0 and from dimensions of the activations, and only next to a projection
  or the attention op, where every dimension is a batch size, a sequence length (at least 1 in any run) or
  a head count.
- :func:`packed_attention_inputs`: where the packed projection's Split feeds the op's query, key and value
  (each through a Reshape to the same ``[B, S, heads*D]``), the op takes the packed tensor as its query and
  no key or value, ONNX Runtime's packed-QKV form, and the Split and Reshapes go.

And one beside them, :func:`heads_read_tables`: an output head tied to the embedding reads the lookup's table
through a ``Transpose`` (the export stores a weight transposed only where the transpose is its one reader), which
ONNX Runtime folds each time it opens the model, a transposed copy made while the weights are prepacked: a
Qwen2.5-1.5B-shaped float32 folder (a 151936 x 1536 table) opened in 10.7-15.6 s with it, 6.9-10.9 s without
(2 cores, three opens each, alternating). The head becomes ``FusedMatMul(x, table, transB=1)``, ONNX Runtime's
MatMul kernel reading B transposed as it packs it: the same products, the same greedy tokens and time per token
there.
"""

from __future__ import annotations

from infopt.core import onnx_graph

PROJECTIONS = ("MatMul", "MatMulNBits", "MatMulInteger", "Split", "Add", "GroupQueryAttention")
"""what a collapsed chain reads from or feeds (a projection, its bias or the packed projections' split, or the
attention op)"""
DIMENSION_OPS = ("Shape", "Gather", "Unsqueeze", "Squeeze", "Slice", "Cast", "Concat")


FLOAT = 1
"""float32 (``onnx.TensorProto``): the type ONNX Runtime's CPU ``FusedMatMul`` takes"""
MS_DOMAIN = "com.microsoft"
SHAPE_TYPES = (6, 7)
"""int32 and int64 (``onnx.TensorProto``): the types a shape or an index is written in"""


def collapse_reshapes(model) -> int:
    """Collapse every such chain of ``model`` (an ``onnx.ModelProto``) in place; returns how many Reshapes went."""
    from onnx import numpy_helper

    graph = model.graph
    # the shape constants only: converting every weight would copy the whole model (2 GB at Qwen2.5-0.5B's fp32)
    constants = {i.name: numpy_helper.to_array(i) for i in graph.initializer if len(i.dims) <= 1 and i.data_type in SHAPE_TYPES}
    producer = {out: node for node in graph.node for out in node.output}
    consumers = onnx_graph.consumers(graph)
    outputs = {o.name for o in graph.output}
    for node in graph.node:
        if node.op_type == "Constant" and node.attribute and node.attribute[0].name == "value":
            constants[node.output[0]] = numpy_helper.to_array(node.attribute[0].t)

    def without_zero(name: str, depth: int = 0) -> bool:
        if name in constants:
            return not (constants[name] == 0).any()
        node = producer.get(name)
        if node is None or depth > 6 or node.op_type not in DIMENSION_OPS:
            return False
        if node.op_type == "Concat":
            return all(without_zero(i, depth + 1) for i in node.input)
        return node.op_type != "Cast" or without_zero(node.input[0], depth + 1)

    dropped: set[int] = set()
    for node in graph.node:
        inner = producer.get(node.input[0]) if node.op_type == "Reshape" else None
        if inner is None or inner.op_type != "Reshape" or id(inner) in dropped:
            continue
        source = producer.get(inner.input[0])
        beside = (source is not None and source.op_type in PROJECTIONS) or any(
            c.op_type in PROJECTIONS for c in consumers.get(node.output[0], []))
        if (not beside or len(consumers.get(inner.output[0], [])) != 1 or inner.output[0] in outputs
                or not without_zero(node.input[1])):
            continue
        node.input[0] = inner.input[0]
        dropped.add(id(inner))
    if dropped:
        kept = [n for n in graph.node if id(n) not in dropped]
        del graph.node[:]
        graph.node.extend(kept)
    return len(dropped)


def packed_attention_inputs(model) -> int:
    """Feed each ``GroupQueryAttention`` whose query, key and value are the Reshaped outputs of one Split, in
    order, that Split's input (packed QKV), in place; returns how many ops now take it."""
    graph = model.graph
    producer = {out: node for node in graph.node for out in node.output}
    consumers = onnx_graph.consumers(graph)
    dropped: set[int] = set()
    fed = 0
    for node in graph.node:
        if node.op_type != "GroupQueryAttention" or len(node.input) < 3:
            continue
        views = [producer.get(name) for name in node.input[:3]]
        if any(v is None or v.op_type != "Reshape" or len(consumers.get(v.output[0], [])) != 1 for v in views):
            continue
        split = producer.get(views[0].input[0])
        if (split is None or split.op_type != "Split" or list(split.output) != [v.input[0] for v in views]
                or any(len(consumers.get(out, [])) != 1 for out in split.output)):
            continue
        node.input[0], node.input[1], node.input[2] = split.input[0], "", ""
        dropped |= {id(split), *(id(v) for v in views)}
        fed += 1
    if dropped:
        kept = [n for n in graph.node if id(n) not in dropped]
        del graph.node[:]
        graph.node.extend(kept)
        _drop_unread_initializers(graph)
    return fed


def _drop_unread_initializers(graph) -> None:
    """Remove the initializers no node reads any more (the dropped Splits' sizes, the Reshapes' shapes), which
    ONNX Runtime would otherwise warn about on every session it opens."""
    read = {name for node in graph.node for name in node.input} | {o.name for o in graph.output}
    onnx_graph.drop_initializers(graph, {t.name for t in graph.initializer} - read)


def heads_read_tables(model) -> int:
    """Each ``MatMul(x, Transpose(W))`` of ``model`` (an ``onnx.ModelProto``) whose ``W`` is a 2-D float32
    initializer becomes ``FusedMatMul(x, W, transB=1)``, in place (the node's metadata kept), and a Transpose no
    longer read goes; returns how many."""
    from onnx import helper

    graph = model.graph
    tables = {i.name for i in graph.initializer if len(i.dims) == 2 and i.data_type == FLOAT}
    producer = {out: node for node in graph.node for out in node.output}
    fused: dict[int, object] = {}
    for node in graph.node:
        transpose = producer.get(node.input[1]) if node.op_type == "MatMul" and len(node.input) == 2 else None
        if (transpose is None or transpose.op_type != "Transpose" or transpose.input[0] not in tables
                or node.domain not in ("", "ai.onnx") or transpose.domain not in ("", "ai.onnx")
                or any(list(a.ints) != [1, 0] for a in transpose.attribute if a.name == "perm")):
            continue
        head = helper.make_node("FusedMatMul", [node.input[0], transpose.input[0]], list(node.output),
                                name=f"{node.name or transpose.input[0]}_transposed_b", domain=MS_DOMAIN, transB=1)
        head.metadata_props.extend(node.metadata_props)
        fused[id(node)] = head
    if not fused:
        return 0
    nodes = [fused.get(id(n), n) for n in graph.node]
    read = {name for n in nodes for name in n.input} | {o.name for o in graph.output}
    kept = [n for n in nodes if n.op_type != "Transpose" or any(out in read for out in n.output)]
    del graph.node[:]
    graph.node.extend(kept)
    if not any(o.domain == MS_DOMAIN for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid(MS_DOMAIN, 1))
    return len(fused)
