"""What a pass let go of is handed back (``core/memory.py``): an ONNX graph the exporter's optimizer rewrote is not
kept alive, with the model's weights, by onnxscript's rewrite rules (each rule's matcher holds the last graph it
matched until its next use)."""

from __future__ import annotations

import gc
import weakref

import numpy as np
import pytest

ir = pytest.importorskip("onnx_ir")
optimizer = pytest.importorskip("onnxscript.optimizer")


def optimized_graph() -> weakref.ref:
    """A weakref to the graph of a small model the default optimizer (with its rewrite rules) has run on."""
    weight = np.ones((64, 64), np.float32)
    x = ir.Value(name="x", shape=ir.Shape([1, 64]), type=ir.TensorType(ir.DataType.FLOAT))
    w = ir.Value(name="w", shape=ir.Shape([64, 64]), type=ir.TensorType(ir.DataType.FLOAT), const_value=ir.tensor(weight))
    matmul = ir.node("MatMul", [x, w])
    identity = ir.node("Identity", matmul.outputs)  # a no-op: a rule matches, and keeps the graph
    graph = ir.Graph([x], identity.outputs, nodes=[matmul, identity], initializers=[w], opset_imports={"": 20})
    model = ir.Model(graph, ir_version=10)
    optimizer.optimize_ir(model)
    return weakref.ref(model.graph)


def test_release_lets_go_of_the_graph_the_rewrite_rules_matched_last():
    from infopt.core.memory import release

    graph = optimized_graph()
    gc.collect()
    # here onnxscript's rules still hold it: the reason for the release
    release(least=0)
    assert graph() is None, "the optimized graph is still referenced after release()"


def test_a_build_leaves_older_objects_out_of_collections_and_hands_the_collector_back_as_it_was():
    from infopt.core.memory import older_objects_frozen

    class Node:
        pass

    assert gc.get_freeze_count() == 0
    with older_objects_frozen():
        frozen = gc.get_freeze_count()
        assert frozen > 1000  # the imports' objects
        with older_objects_frozen():  # a build inside a build (build() routing to build_generation)
            pass
        assert gc.get_freeze_count() > frozen // 2  # still frozen (a frozen object freed by its count leaves it)
        made = Node()
        made.self = made  # a cycle made during the build is still collected
        gone = weakref.ref(made)
        del made
        gc.collect()
        assert gone() is None
    assert gc.get_freeze_count() == 0


@pytest.mark.parametrize("preset,want", [(None, "1"), ("0", "0")])
def test_the_command_line_asks_torch_for_huge_pages_unless_told_otherwise(preset, want):
    import os
    import subprocess
    import sys

    from infopt.core.memory import TENSOR_HUGE_PAGES

    env = {k: v for k, v in os.environ.items() if k != TENSOR_HUGE_PAGES}
    if preset is not None:
        env[TENSOR_HUGE_PAGES] = preset
    script = f"import os, infopt.cli; print(os.environ.get({TENSOR_HUGE_PAGES!r}))"
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True).stdout
    assert out.strip() == want
