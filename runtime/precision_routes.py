"""``infopt doctor``'s rows for the 8-bit routes: which FP8 and INT8 models this machine can build, and where it
can validate them. An ONNX Q/DQ model is built anywhere; ONNX Runtime's CPU provider validates it (FP8 by
dequantizing, so its drift is real and its speed is not a GPU's), which a tiny FP8 graph run here proves; a
TensorRT engine needs TensorRT and a GPU on the build machine."""

from __future__ import annotations

from typing import Any

from infopt.runtime.backend import check
from infopt.runtime.backends.tensorrt import tensorrt_unavailable


def _fp8_runs_on_onnxruntime() -> str | None:
    """None when ONNX Runtime's CPU provider runs a float8e4m3fn DequantizeLinear (opset 19); else why not."""
    try:
        import numpy as np
        import onnxruntime as ort
        from onnx import TensorProto, helper
    except ImportError as exc:
        return f"cannot import {exc.name}"
    weight = helper.make_tensor("w", TensorProto.FLOAT8E4M3FN, [2], b"\x38\x40", raw=True)  # 1.0 and 2.0
    zero = helper.make_tensor("z", TensorProto.FLOAT8E4M3FN, [], b"\x00", raw=True)
    scale = helper.make_tensor("s", TensorProto.FLOAT, [], [1.0])
    graph = helper.make_graph([helper.make_node("DequantizeLinear", ["w", "s", "z"], ["d"]),
                               helper.make_node("Mul", ["x", "d"], ["y"])], "probe",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])], [weight, zero, scale])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])
    try:
        session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        got = session.run(None, {"x": np.ones(2, np.float32)})[0]
    except Exception as exc:  # noqa: BLE001 - any failure means this ONNX Runtime cannot validate FP8
        return f"ONNX Runtime {ort.__version__} cannot run FP8 DequantizeLinear: {type(exc).__name__}"
    return None if np.allclose(got, [1.0, 2.0]) else f"ONNX Runtime {ort.__version__} dequantized FP8 wrongly"


def checks() -> list[dict[str, Any]]:
    fp8 = _fp8_runs_on_onnxruntime()
    engine = tensorrt_unavailable()
    return [
        check("FP8 Q/DQ ONNX (--fp8)", fp8 is None,
              "built here; validated here on ONNX Runtime's CPU provider (FP8 emulated: real drift, not the GPU's "
              "speed)" if fp8 is None else fp8, "pip install -U onnxruntime (1.16 or later runs FP8 Q/DQ)"),
        check("INT8 Q/DQ ONNX (--int8)", True, "built here; validated and timed here on ONNX Runtime's CPU provider"),
        check("FP8 and INT8 TensorRT engines", engine is None,
              "built and validated here on the GPU" if engine is None else f"not built here: {engine}; the Q/DQ ONNX "
              "model ships and the server builds the engine (INT8), or a GPU machine builds it (FP8)",
              "build on a machine with TensorRT and an NVIDIA GPU (pip install tensorrt)"),
    ]
