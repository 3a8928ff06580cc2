"""A decoder exported with its first two layers, stamped to all of them (``onnx_ir``, in place).

``capture_kv_decoder`` captures a probe where a model's layers are alike (``exporters/layer_probe.py``);
``onnx_export`` translates it without the exporter's optimizer and hands it here:

1. :func:`hide_weights`: the module's tensors become graph inputs while the optimizer runs, so it folds
   nothing computed from a weight and merges no two equal weights (a random checkpoint's norms);
2. :func:`stamp`: the second layer's nodes (those whose ``name_scopes`` say ``layers.1`` and that read a layer's
   weight, cache or hidden state) are the template; each copy reads the previous copy's hidden state, its own
   ``past_key_values.<i>`` and its own weights, and writes ``present.<i>``; the nodes after the layers read the
   last copy. The first layer's nodes must match the template node for node, else the model is not stamped;
3. :func:`restore_weights`: the inputs become initializers again, each stamped layer's read from the model
   (no copy); sibling projections (query/key/value, gate/up) packed into one MatMul each (``onnx_pack.py``), and a
   weight whose only reader is a ``Transpose`` is stored transposed, both computed when the file is written (the
   exporter's optimizer folds those too).
"""

from __future__ import annotations

import re
from typing import Any

from infopt.core.errors import CaptureError
from infopt.core.onnx_graph import SCOPES
from infopt.exporters import kv_decoder
from infopt.exporters.layer_probe import PROBE_LAYERS, LayerStamp
from infopt.passes.lower.onnx_pack import pack_projections


def hide_weights(graph, names) -> dict[str, Any]:
    """The initializers named in ``names`` moved to the graph's inputs; returns name -> its tensor."""
    tensors = {}
    for name in [n for n in graph.initializers if n in names]:
        value = graph.initializers.pop(name)
        tensors[name] = value.const_value
        value.const_value = None
        graph.inputs.append(value)
    return tensors


def restore_weights(model, tensors: dict[str, Any]) -> int:
    """The hidden weights back as initializers (those still read); then sibling projections packed
    (``onnx_pack.py``), single-reader transposes folded, and what the optimizer folds from small weights (Gemma's
    ``1 + weight`` of a norm). Returns how many groups of projections were packed."""
    from onnxscript.optimizer import fold_constants, remove_unused_nodes

    graph = model.graph
    for value in [v for v in graph.inputs if v.name in tensors]:
        graph.inputs.remove(value)
        if value.uses():
            value.const_value = tensors[value.name]
            graph.register_initializer(value)
    packed = pack_projections(graph)
    _fold_transposes(graph)
    fold_constants(model)
    remove_unused_nodes(model)
    return packed


def _fold_transposes(graph) -> None:
    import onnx_ir as ir

    for node in [n for n in graph if n.op_type == "Transpose" and n.domain == ""]:
        source = node.inputs[0]
        if source is None or source.const_value is None or len(source.uses()) != 1 or not source.is_initializer():
            continue
        perm = node.attributes["perm"].as_ints() if "perm" in node.attributes else None
        tensor = source.const_value
        shape = [tensor.shape[p] for p in perm] if perm else list(reversed(tensor.shape))
        out = node.outputs[0]
        folded = ir.Value(name=out.name, shape=ir.Shape(shape), type=out.type,
                          const_value=ir.LazyTensor(_transposed(tensor, perm), dtype=tensor.dtype, shape=ir.Shape(shape)))
        out.replace_all_uses_with(folded)
        graph.remove(node, safe=False)
        graph.initializers.pop(source.name)
        graph.register_initializer(folded)


def _transposed(tensor, perm):
    """The tensor's transpose, computed when the file is written: by torch (a blocked copy on every thread, half
    numpy's time, 3.7 s of a 1.5B decoder's float32 weights), or numpy for a dtype torch has no array of."""
    def compute():
        import numpy as np
        import onnx_ir as ir
        import torch

        array = tensor.numpy()
        order = list(perm) if perm else list(reversed(range(array.ndim)))
        try:
            return ir.tensor(torch.from_numpy(array).permute(order).contiguous().numpy())
        except TypeError:  # bfloat16 and the float8s: numpy (ml_dtypes)
            return ir.tensor(np.ascontiguousarray(np.transpose(array, order)))
    return compute


def stamp(graph, plan: LayerStamp, tensors: dict[str, Any]) -> int:
    """Stamp the template for layers ``PROBE_LAYERS..plan.layers-1`` (see the module doc); new weights are added to
    ``tensors``. Returns the nodes added. Raises CaptureError where the probe's layers do not match."""
    prefix = f"lm.{plan.path}."
    layer_re = re.compile(re.escape(prefix) + r"(\d+)(?=\D|$)")
    deps = _dependencies(graph, layer_re)
    scoped = _scopes(graph, layer_re)

    def own(node, layer: int) -> bool:
        """In the layer, and not a weightless node the exporter shares with others (a shape computed once)."""
        return scoped[node] == layer and (bool(deps[node]) or all(
            scoped[user] == layer for out in node.outputs for user, _ in out.uses()))

    first = [node for node in graph if own(node, 0)]
    template = [node for node in graph if own(node, 1)]
    inside = _positions(template)
    at_place = {place: value for value, place in inside.items()}
    carried = {value: at_place[place] for value, place in _match(first, template, _positions(first), inside,
                                                                 prefix).items()}
    last = PROBE_LAYERS - 1
    copies: dict[int, dict[Any, Any]] = {last: {v: v for v in inside}}
    anchor = template[-1]
    inputs = {v.name: v for v in graph.inputs}
    stamped: set = set()
    for index in range(PROBE_LAYERS, plan.layers):
        made = copies[index] = {}
        for node in template:
            new_inputs = [_input(v, index, made, copies[index - 1], carried, inside, prefix, graph, inputs, plan,
                                 tensors) for v in node.inputs]
            clone = _clone(node, new_inputs, index, layer_re)
            for old, new in zip(node.outputs, clone.outputs):
                made[old] = new
                renamed = _renamed(old.name, index, prefix)
                new.name = renamed if renamed != old.name else f"{old.name}_layer{index}"
                new.shape, new.type = old.shape, old.type
            graph.insert_after(anchor, clone)
            anchor = clone
            stamped.add(clone)
    _rewire_after(graph, {*first, *template, *stamped}, copies[plan.layers - 1], _positions(first))
    _order_io(graph, [copies[i] for i in range(PROBE_LAYERS, plan.layers)])
    graph.sort()
    return len(stamped)


def _rewire_after(graph, layers: set, last: dict, first_at: dict) -> None:
    """The nodes after the layers read the last layer's copies of the template's values."""
    for node in graph:
        if node in layers:
            continue
        for i, value in enumerate(node.inputs):
            if value in last:
                node.replace_input_with(i, last[value])
            elif value in first_at:
                raise CaptureError(f"node {node.name} after the layers reads the first layer's {value.name}")


def _order_io(graph, copies: list[dict]) -> None:
    """Graph inputs and outputs in the decoder's order: each layer's cache after the one before."""
    pasts = [v for v in graph.inputs if (v.name or "").startswith("past_key_values.")]
    others = [v for v in graph.inputs if v not in pasts]
    pasts.sort(key=lambda v: (int(v.name.split(".")[1]), v.name.split(".")[2] != "key"))
    graph.inputs.clear()
    graph.inputs.extend([*others[:2], *pasts, *others[2:]])
    presents = [v for v in graph.outputs if (v.name or "").startswith("present.")]
    presents += [made[v] for made in copies for v in presents if v in made]
    rest = [v for v in graph.outputs if not (v.name or "").startswith("present.")]
    graph.outputs.clear()
    graph.outputs.extend([*rest, *presents])


def _dependencies(graph, layer_re) -> dict:
    """node -> the layers whose weights, cache or hidden state it reads (an empty set: shared by every layer; a
    shape is no reading)."""
    layered: dict[Any, frozenset] = {}
    for value in graph.inputs:
        found = re.match(r"past_key_values\.(\d+)\.", value.name or "") or layer_re.match(value.name or "")
        layered[value] = frozenset({int(found.group(1))}) if found else frozenset()
    result = {}
    for node in graph:
        # a shape reads no values: the past's length is every layer's, whichever layer's cache it was read from
        shaped = node.op_type in ("Shape", "Size") and node.domain == ""
        mine = frozenset() if shaped else frozenset().union(
            *(layered.get(v, frozenset()) for v in node.inputs if v is not None))
        result[node] = mine
        for out in node.outputs:
            layered[out] = mine
    return result


def _scopes(graph, layer_re) -> dict:
    """node -> the layer it belongs to (None: none). A node the optimizer made has no scopes of its own; it is the
    layer's whose nodes write its inputs and read its outputs, where that is one layer."""
    scoped = {node: _layer_of(node, layer_re) for node in graph}
    for node in graph:
        if node.metadata_props.get(SCOPES):
            continue
        around = {scoped.get(v.producer()) for v in node.inputs if v is not None and v.producer() is not None}
        around |= {scoped[user] for out in node.outputs for user, _ in out.uses() if user.metadata_props.get(SCOPES)}
        if len(around) == 1:
            scoped[node] = around.pop()
    return scoped


def _layer_of(node, layer_re) -> int | None:
    found = {int(m) for m in layer_re.findall(node.metadata_props.get(SCOPES, ""))}
    if len(found) > 1:
        raise CaptureError(f"node {node.name} is scoped to layers {sorted(found)}")
    return found.pop() if found else None


def _positions(nodes) -> dict:
    """value -> (node's index in the list, output index), for the values the nodes write."""
    return {out: (k, j) for k, node in enumerate(nodes) for j, out in enumerate(node.outputs)}


def _match(first, template, first_at, inside, prefix) -> dict:
    """Check that layer 0's nodes are the template's, node for node; returns the template's inputs carried from
    layer 0 (its hidden state): value -> its place among layer 0's outputs."""
    if not template or len(first) != len(template):
        raise CaptureError(f"the probe's layers differ: {len(first)} nodes in layer 0, {len(template)} in layer 1")
    carried = {}
    for k, (a, b) in enumerate(zip(first, template)):
        if (a.op_type, a.domain, len(a.inputs), len(a.outputs)) != (b.op_type, b.domain, len(b.inputs), len(b.outputs)) \
                or _attributes(a) != _attributes(b):
            raise CaptureError(f"the probe's layers differ at node {k}: {a.op_type} against {b.op_type}")
        for x, y in zip(a.inputs, b.inputs):
            if y is None or x is None:
                if (x is None) != (y is None):
                    raise CaptureError(f"the probe's layers differ at node {k} ({b.op_type}): an input left out")
            elif y in inside:
                if first_at.get(x) != inside[y]:
                    raise CaptureError(f"the probe's layers differ at node {k} ({b.op_type}): its inputs")
            elif y in first_at:
                carried[y] = first_at[y]
            elif (y.name or "").startswith(f"{prefix}1.") and x.name != f"{prefix}0.{y.name[len(prefix) + 2:]}":
                raise CaptureError(f"the probe's layers read different weights at node {k}: {x.name}, {y.name}")
    return carried


def _attributes(node) -> dict:
    return {name: repr(attr.value) for name, attr in node.attributes.items()}


def _input(value, index, made, previous, carried, inside, prefix, graph, inputs, plan, tensors):
    """The value a stamped node of layer ``index`` reads where the template reads ``value``."""
    import onnx_ir as ir

    if value is None:
        return None
    if value in inside:
        return made[value]
    if value in carried:  # the previous layer's hidden state: its copy of the template's value
        return previous[carried[value]]
    name = value.name or ""
    renamed = _renamed(name, index, prefix)
    if renamed == name:
        return value  # shared by every layer
    if renamed not in inputs:
        new = ir.Value(name=renamed, shape=value.shape, type=value.type)
        graph.inputs.append(new)
        inputs[renamed] = new
        if name.startswith(prefix):
            tensors[renamed] = _torch_tensor(plan.tensor(renamed), renamed)
    return inputs[renamed]


def _renamed(name: str, index: int, prefix: str) -> str:
    """A template value's name in layer ``index``."""
    for pattern in (kv_decoder.PAST, kv_decoder.PRESENT):
        for kv in ("key", "value"):
            if name == pattern.format(PROBE_LAYERS - 1, kv):
                return pattern.format(index, kv)
    if name.startswith(f"{prefix}{PROBE_LAYERS - 1}."):
        return f"{prefix}{index}.{name[len(prefix) + 2:]}"
    return name


def _torch_tensor(tensor, name: str):
    from torch.onnx._internal.exporter._core import TorchTensor

    return TorchTensor(tensor.detach(), name=name)


def _clone(node, inputs, index, layer_re):
    import onnx_ir as ir

    clone = ir.Node(node.domain, node.op_type, inputs, attributes=list(node.attributes.values()),
                    overload=node.overload, num_outputs=len(node.outputs), version=node.version,
                    name=f"{node.name}_layer{index}")
    for key, text in node.metadata_props.items():
        clone.metadata_props[key] = layer_re.sub(lambda m: m.group(0)[: -len(m.group(1))] + str(index), text)
    return clone
