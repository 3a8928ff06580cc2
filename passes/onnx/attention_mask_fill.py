"""Additive attention masks filled with -40 instead of float32's lowest value (or -10000, or -inf).

A transformer masks padded keys by adding a large negative number to their attention scores before
the Softmax: ``where(mask, 0, finfo.min)`` or ``(1 - mask) * -10000``. Every masked score then
reaches ONNX Runtime's CPU Softmax as an exponent below about -80, where its exp kernel leaves the
fast path on some CPUs: there Softmax can take many times what it takes on the same shape unmasked,
while on others the fill makes no difference (benchmarks/results/rules.md).

-40 masks as well: a masked key's weight is at most exp(-40 + d) of the strongest real key's, d being
how far its raw score is above that key's (exp(-40) is 4e-18; d would have to pass 24 for the
weight to reach float32's rounding, 1e-7), and the exponents stay clear of the slow range for
scores spread over up to 40. One thing does change: a row with no real key at all (an empty
sequence) attended uniformly to its padding, because float32's lowest swallows the scores it is
added to; with -40 it attends by the padding's own scores. Its output was padding either way, and a
mean pooled over the mask (a sentence embedding) is zero either way. The build's validation
compares the result with the original model like any other pass.

Only the mask's constant changes, and only where the mask is used for nothing else: the mask comes
from a ``Where`` or ``Mul`` with a scalar constant at or below -10000 (through shape-only ops), and
each use of it is an ``Add`` whose only consumers are last-axis Softmax nodes. GPU targets are left as
exported (the slow path is ONNX Runtime's CPU kernel).
"""

from __future__ import annotations

import numpy as np

from infopt.core import onnx_graph
from infopt.core.artifact import Artifact
from infopt.core.pass_api import Pass, PassContext, PassDetails, PassOptions, PassOutcome
from infopt.passes.onnx.checks import check_for_onnxruntime

FILL = -40.0
"""The mask value written in place of float32's lowest (see the module's text for why -40)."""

LARGE_NEGATIVE = -1e4
"""A scalar constant at or below this, in a Where or Mul whose result is added to Softmax input, is a mask fill."""

PASS_THROUGH = {"Expand", "Unsqueeze", "Squeeze", "Reshape", "Cast", "Slice", "Identity"}
"""Ops that carry a mask to its Add without changing its values (shape or dtype only)."""


def _scalar_constants(graph) -> dict[str, np.ndarray]:
    """Scalar (or one-element) float initializers and Constant outputs: name -> the value, 0-d."""
    from onnx import numpy_helper

    found = {}
    tensors = [(i.name, i) for i in graph.initializer]
    tensors += [(n.output[0], a.t) for n in graph.node if n.op_type == "Constant" for a in n.attribute if a.name == "value"]
    for name, tensor in tensors:
        if tensor.data_location == tensor.EXTERNAL:  # not loaded (a graph read without its tensors): no scalar
            continue
        if tensor.data_type in (1, 10, 11) and int(np.prod(tensor.dims)) == 1:  # float, float16, double
            found[name] = numpy_helper.to_array(tensor).reshape(())
    return found


def _last_axis_softmax(node, opset: int) -> bool:
    axis = next((a.i for a in node.attribute if a.name == "axis"), -1 if opset >= 13 else 1)
    return node.op_type == "Softmax" and axis == -1


def masks(model) -> list[tuple[object, int, int]]:
    """The mask fills to change: (Where or Mul node, index of its large negative constant input, how many
    Softmax nodes the mask reaches)."""
    graph = model.graph
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 13)
    consumers = onnx_graph.consumers(graph)
    producers = {o: n for n in graph.node for o in n.output}
    scalars = _scalar_constants(graph)
    outputs = {o.name for o in graph.output}

    def softmax_reached(name: str) -> int:
        """How many Softmax nodes ``name`` reaches if every use of it (through shape-only ops) is an Add whose
        only consumers are last-axis Softmax nodes; 0 if any use is anything else."""
        users = consumers.get(name, [])
        if name in outputs or not users:
            return 0
        reached = 0
        for user in users:
            if user.op_type in PASS_THROUGH:
                below = softmax_reached(user.output[0])
            elif user.op_type == "Add":
                after = consumers.get(user.output[0], [])
                ok = user.output[0] not in outputs and after and all(_last_axis_softmax(s, opset) for s in after)
                below = len(after) if ok else 0
            else:
                below = 0
            if not below:
                return 0
            reached += below
        return reached

    found, seen = [], set()
    for softmax in (n for n in graph.node if _last_axis_softmax(n, opset)):
        add = producers.get(softmax.input[0])
        if add is None or add.op_type != "Add":
            continue
        for term in add.input:
            node = producers.get(term)
            while node is not None and node.op_type in PASS_THROUGH:
                node = producers.get(node.input[0])
            if node is None or id(node) in seen or node.op_type not in ("Where", "Mul"):
                continue
            candidates = (1, 2) if node.op_type == "Where" else (0, 1)
            index = next((i for i in candidates if node.input[i] in scalars and scalars[node.input[i]] <= LARGE_NEGATIVE),
                         None)
            reached = softmax_reached(node.output[0]) if index is not None else 0
            if reached:
                seen.add(id(node))
                found.append((node, index, reached))
    return found


def fill(model) -> tuple[list[float], int]:
    """Write ``FILL`` in place of each mask's large negative constant in ``model`` (in place); returns the
    values replaced and how many Softmax nodes the masks reach. A constant shared with other nodes is
    left to them: the mask gets its own."""
    from onnx import numpy_helper

    graph = model.graph
    scalars = _scalar_constants(graph)
    replaced, softmax = [], 0
    for node, index, reached in masks(model):
        old = scalars[node.input[index]]
        name = f"{node.name or node.input[index]}_mask_fill"
        graph.initializer.append(numpy_helper.from_array(np.array(FILL, dtype=old.dtype), name))
        node.input[index] = name
        replaced.append(float(old))
        softmax += reached
    return replaced, softmax


def run(artifact: Artifact, options: PassOptions, context: PassContext) -> PassOutcome:
    if context.target.device != "cpu":
        return PassOutcome(artifact, False, [f"skipped: target {context.target.name} is not a CPU "
                                             f"(the masked-Softmax slow path is ONNX Runtime's CPU kernel)"])
    model = onnx_graph.load_graph(artifact.path)  # the graph only: the mask's constant is a scalar inside it
    onnx_graph.ensure_node_names(model)
    replaced, softmax = fill(model)
    if not replaced:
        return PassOutcome(artifact, False, ["no additive attention mask with a large negative fill feeds a Softmax"])
    path = onnx_graph.save_graph(model, artifact.path, context.workdir / "attention-mask-fill.onnx")
    check_for_onnxruntime(path)
    values = sorted({f"{v:.3g}" for v in replaced})
    return PassOutcome(artifact.derive("onnx", path=path), True,
                       [f"{len(replaced)} attention mask(s), added before {softmax} Softmax node(s), filled with "
                        f"{FILL:g} instead of {', '.join(values)} (same attention; ONNX Runtime's CPU Softmax is "
                        f"slow on float32's lowest on some CPUs)"],
                       MaskFillDetails(masks=len(replaced), softmax=softmax, fill=FILL, replaced=values))


class MaskFillDetails(PassDetails):
    """What ``attention_mask_fill`` records: how many masks it changed, to what, from what."""

    masks: int
    softmax: int
    """Softmax nodes the masks are added before"""
    fill: float
    replaced: list[str]
    """the fills it replaced, as printed (float32's lowest is -3.4e+38)"""


PASS = Pass(
    name="attention_mask_fill",
    consumes="onnx",
    produces="onnx",
    run=run,
    options=PassOptions,
    details=MaskFillDetails,
    description="fill additive attention masks with -40 instead of float32's lowest: same attention, "
                "and no slow path in ONNX Runtime's CPU Softmax on the CPUs that have one",
)
