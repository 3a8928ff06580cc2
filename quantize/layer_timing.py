"""What each layer costs, per run, as ONNX Runtime runs it: the time its INT8 form saves over FP32.

ONNX Runtime's profiler records every kernel it runs under the node's name after its graph
fusions, and those names keep the original node's name in front (``node_MatMul_3/MatMulAddFusion``
for a MatMul fused with its bias into a Gemm, ``node_MatMul_3_quant`` for the integer matmul the
quantizer writes for it). So one profiled session of the FP32 model and one of the model with every
layer in INT8, on the same inputs, give each layer's time in both precisions; what INT8 saves per
layer is the difference. Kernels named after no layer (activation quantizers, norms, softmax) are
left out: they are the same whichever layers are quantized, or shared between them.

The fallback uses it to move to FP32 the layers that cost the most drift per millisecond they save
(``sensitivity.order_by_cost``), rather than the most drift alone.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import numpy as np

from infopt.core.threads import ort_session_options
from infopt.core.work_folders import work_folder

SEPARATORS = ("/", "_")


def owner(kernel: str, layers: list[str]) -> str | None:
    """The layer a profiled kernel belongs to: the longest layer name it starts with, followed by a
    separator (``node_MatMul_1`` owns ``node_MatMul_1_quant`` but not ``node_MatMul_10_quant``)."""
    best = None
    for layer in layers:
        if kernel == layer or any(kernel.startswith(layer + sep) for sep in SEPARATORS):
            if best is None or len(layer) > len(best):
                best = layer
    return best


def kernel_times(path: Path, feed: dict[str, np.ndarray], runs: int) -> dict[str, float]:
    """Microseconds per run of every kernel ONNX Runtime ran for ``path`` on ``feed`` (by node name):
    the median of each kernel's ``runs`` + 1 durations (the first run's allocations and a noisy
    neighbour's stalls do not count)."""
    import onnxruntime as ort

    with work_folder("profile") as tmp:
        options = ort_session_options()
        options.enable_profiling = True
        options.profile_file_prefix = str(Path(tmp) / "run")
        sess = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        for _ in range(runs + 1):
            sess.run(None, feed)
        trace = json.loads(Path(sess.end_profiling()).read_text())
    durations: dict[str, list[float]] = defaultdict(list)
    for event in trace:
        name = event.get("name", "")
        if event.get("cat") == "Node" and name.endswith("_kernel_time"):
            durations[name[: -len("_kernel_time")]].append(float(event.get("dur", 0)))
    return {name: float(np.median(d)) * len(d) / (runs + 1) for name, d in durations.items()}


def per_layer(times: dict[str, float], layers: list[str]) -> dict[str, float]:
    """Kernel times summed per owning layer (milliseconds); layers that ran no kernel of their own get 0."""
    out = dict.fromkeys(layers, 0.0)
    for kernel, us in times.items():
        layer = owner(kernel, layers)
        if layer is not None:
            out[layer] += us / 1e3
    return out


def savings(fp32: Path, int8: Path, layers: list[str], feed: dict[str, np.ndarray], runs: int = 10) -> dict[str, float]:
    """Milliseconds per run that each layer's INT8 form saves over its FP32 form (negative: INT8 is slower)."""
    before = per_layer(kernel_times(fp32, feed, runs), layers)
    after = per_layer(kernel_times(int8, feed, runs), layers)
    return {layer: before[layer] - after[layer] for layer in layers}
