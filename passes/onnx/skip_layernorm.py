"""SkipLayerNormalization taken back apart into Sum + LayerNormalization where that runs faster.

ONNX Runtime's offline optimization fuses a residual ``Add`` and the ``LayerNormalization`` after it
into its contrib ``SkipLayerNormalization``. On CPU that fused kernel can be the slower form, several times
slower than ``Sum`` + ``LayerNormalization`` on one machine (benchmarks/results/rules.md). Which form is faster
depends on the CPU and the runtime, so it is measured here, on the machine that builds, at the
model's hidden size, and the graph is only changed when the pair is clearly faster.

``Sum`` rather than ``Add``: ONNX Runtime fuses ``Add`` + ``LayerNormalization`` again when it loads
the model (every server does), but has no fusion for ``Sum``. The result is the same sum.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from infopt.core.threads import ort_session_options

FUSED = "SkipLayerNormalization"
CONTRIB = "com.microsoft"
DEFAULT_EPSILON = 1e-12
"""SkipLayerNormalization's epsilon when the node has none (ONNX Runtime's contrib schema)."""
FASTER_BY = 0.9
"""Unfuse only when the pair takes at most this fraction of the fused kernel's time."""


@dataclass
class Timing:
    """One measurement of the two forms, on ``shape``, in milliseconds (median of interleaved runs)."""

    shape: tuple[int, ...]
    fused_ms: float
    unfused_ms: float

    @property
    def unfuse(self) -> bool:
        return self.unfused_ms <= FASTER_BY * self.fused_ms

    def __str__(self) -> str:
        return (f"{FUSED} {self.fused_ms:.3f} ms, Sum + LayerNormalization {self.unfused_ms:.3f} ms on "
                f"[{', '.join(map(str, self.shape))}] here")


def node_epsilon(node) -> float:
    return next((a.f for a in node.attribute if a.name == "epsilon"), DEFAULT_EPSILON)


def fused_nodes(model) -> list:
    """The SkipLayerNormalization nodes that can be unfused: no mean or inverse-std output in use."""
    used = {name for n in model.graph.node for name in n.input} | {o.name for o in model.graph.output}
    return [n for n in model.graph.node if n.op_type == FUSED and n.domain == CONTRIB
            and not any(len(n.output) > i and n.output[i] and n.output[i] in used for i in (1, 2))]


def unfuse(model) -> int:
    """Replace each unfusable SkipLayerNormalization (see ``fused_nodes``) with Sum(input, skip[, bias]) and
    LayerNormalization over the last axis, in place; returns how many."""
    from onnx import helper

    targets = {id(n) for n in fused_nodes(model)}
    nodes = []
    for node in model.graph.node:
        if id(node) not in targets:
            nodes.append(node)
            continue
        inputs = list(node.input) + [""] * (5 - len(node.input))
        terms = [inputs[0], inputs[1]] + ([inputs[4]] if inputs[4] else [])
        total = node.output[3] if len(node.output) > 3 and node.output[3] else f"{node.name}_sum"
        nodes.append(helper.make_node("Sum", terms, [total], name=f"{node.name}_sum"))
        nodes.append(helper.make_node("LayerNormalization", [total, inputs[2]] + ([inputs[3]] if inputs[3] else []),
                                      [node.output[0]], name=f"{node.name}_layernorm", axis=-1, epsilon=node_epsilon(node)))
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    return len(targets)


def _session(nodes, hidden: int):
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    weights = [numpy_helper.from_array(np.ones(hidden, np.float32), "gamma"),
               numpy_helper.from_array(np.zeros(hidden, np.float32), "beta")]
    spec = [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["b", "s", hidden]) for n in ("x", "skip")]
    graph = helper.make_graph(nodes, "skip_layernorm", spec, [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              weights)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(CONTRIB, 1)])
    return ort.InferenceSession(model.SerializeToString(), ort_session_options(), providers=["CPUExecutionProvider"])


def measure(hidden: int, epsilon: float = DEFAULT_EPSILON, tokens: tuple[int, int] = (8, 128), runs: int = 15) -> Timing:
    """Time SkipLayerNormalization against Sum + LayerNormalization on [tokens..., hidden], interleaved."""
    from onnx import helper

    fused = _session([helper.make_node(FUSED, ["x", "skip", "gamma", "beta"], ["y"], domain=CONTRIB, epsilon=epsilon)],
                     hidden)
    pair = _session([helper.make_node("Sum", ["x", "skip"], ["total"]),
                     helper.make_node("LayerNormalization", ["total", "gamma", "beta"], ["y"], axis=-1, epsilon=epsilon)],
                    hidden)
    rng = np.random.default_rng(0)
    feed = {name: rng.standard_normal((*tokens, hidden)).astype(np.float32) for name in ("x", "skip")}
    times: dict[int, list[float]] = {0: [], 1: []}
    for session in (fused, pair) * 2:  # warm both up
        session.run(None, feed)
    for _ in range(runs):
        for index, session in enumerate((fused, pair)):
            start = time.perf_counter()
            session.run(None, feed)
            times[index].append(time.perf_counter() - start)
    return Timing((*tokens, hidden), float(np.median(times[0]) * 1e3), float(np.median(times[1]) * 1e3))


def hidden_size(model, node) -> int | None:
    """The normalized size: gamma's length, when gamma is an initializer."""
    gamma = next((i for i in model.graph.initializer if i.name == node.input[2]), None)
    return int(np.prod(gamma.dims)) if gamma is not None else None
