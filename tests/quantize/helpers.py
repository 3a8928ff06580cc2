"""Small ONNX graphs built by hand, so quantization tests know every tensor's name and value, and activations shaped
like a transformer's."""

from __future__ import annotations

from pathlib import Path

import numpy as np


def layernorm_matmul(path: Path, *, outlier: float = 40.0, seed: int = 0) -> Path:
    """x[batch,16] -> LayerNormalization (one channel's gain ``outlier``) -> MatMul W[16,8] -> Relu
    -> MatMul W2[8,4]. The outlier channel is what SmoothQuant and the observers must handle."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    gamma = np.ones(16, np.float32)
    gamma[3] = outlier
    inits = [numpy_helper.from_array(gamma, "ln.weight"), numpy_helper.from_array(np.zeros(16, np.float32), "ln.bias"),
             numpy_helper.from_array(rng.standard_normal((16, 8)).astype(np.float32) * 0.3, "fc1.weight"),
             numpy_helper.from_array(rng.standard_normal((8, 4)).astype(np.float32) * 0.3, "fc2.weight")]
    nodes = [helper.make_node("LayerNormalization", ["x", "ln.weight", "ln.bias"], ["ln"], name="ln", axis=-1),
             helper.make_node("MatMul", ["ln", "fc1.weight"], ["h"], name="fc1"),
             helper.make_node("Relu", ["h"], ["r"], name="relu"),
             helper.make_node("MatMul", ["r", "fc2.weight"], ["y"], name="fc2")]
    graph = helper.make_graph(nodes, "ln_mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


def run(path: Path, x: np.ndarray) -> np.ndarray:
    import onnxruntime as ort

    from infopt.core.threads import ort_session_options

    return ort.InferenceSession(str(path), ort_session_options(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]


def correlated_inputs(rows: int, features: int, seed: int = 0):
    """Activations with a few dominant directions and some loud features, as in transformers."""
    import torch

    g = torch.Generator().manual_seed(seed)
    basis = torch.randn(8, features, generator=g)
    x = torch.randn(rows, 8, generator=g) @ basis + 0.3 * torch.randn(rows, features, generator=g)
    x[:, :4] *= 12
    return x
