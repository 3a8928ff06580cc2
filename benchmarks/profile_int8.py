"""Where INT8 time goes, op by op: ONNX Runtime's profiler on infopt's static INT8 graph, on ONNX
Runtime's own ``quantize_static`` defaults, and on QDQ variants of infopt's graph.

    PYTHONPATH=. python benchmarks/profile_int8.py [--batch 32] [--runs 300] [--markdown FILE]

For the example DigitsCNN: infopt's FP32 build and its static INT8 build with every layer in INT8
(calibrated on 128 training images, `top1=0.995`, ``choose: first``); `quantize_static(plain, out,
reader)` with every default (QDQ, S8 activations and weights, per-tensor, every op type it knows) on
infopt's plain FP32 export with the same calibration images; and infopt's QDQ writer on that export
with one thing changed at a time (activation type, per-channel weights, which op types get QDQ). Each model runs in its own session
(CPUExecutionProvider, all graph optimizations, 2 intra-op threads) with profiling on; the table
gives each op type's time per run after ORT's fusions (the node names ORT ran), the p50 of the
whole run, and top-1 on the 360 held-out digits.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import numpy as np
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import infopt  # noqa: E402
from benchmarks.common import environment, publish  # noqa: E402

VARIANTS = {
    "infopt QDQ (U8 act, per-channel S8 weights, Conv/MatMul/Gemm)": {},
    "  + S8 activations": {"activation": "int8"},
    "  + per-tensor weights": {"per_channel": False},
    "  + QDQ on Relu/MaxPool/Flatten too": {"extra_ops": True},
    "  + S8, per-tensor, all ops (ORT's defaults)": {"activation": "int8", "per_channel": False, "extra_ops": True},
}


def session(path: Path, profile_dir: Path | None = None):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.intra_op_num_threads = 2
    options.log_severity_level = 3
    if profile_dir is not None:
        options.enable_profiling = True
        options.profile_file_prefix = str(profile_dir / path.stem)
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def profile(path: Path, feed: dict, runs: int, work: Path) -> tuple[dict[str, float], list[float]]:
    """Microseconds per run by op type (from ORT's node events), and each run's wall time in ms."""
    sess = session(path, work)
    for _ in range(20):
        sess.run(None, feed)
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        sess.run(None, feed)
        times.append((time.perf_counter() - start) * 1e3)
    trace = json.loads(Path(sess.end_profiling()).read_text())
    by_op: dict[str, float] = defaultdict(float)
    for event in trace:
        if event.get("cat") == "Node" and event["name"].endswith("_kernel_time"):
            by_op[event["args"]["op_name"]] += event["dur"]
    total_runs = runs + 20
    return {op: us / total_runs for op, us in by_op.items()}, times


def ort_static_defaults(fp32: Path, out: Path, calib: np.ndarray) -> Path:
    from onnxruntime.quantization import CalibrationDataReader, quantize_static

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.items = iter([{"x": calib[i:i + 1]} for i in range(len(calib))])

        def get_next(self):
            return next(self.items, None)

    quantize_static(str(fp32), str(out), Reader())
    return out


def variant(fp32: Path, out: Path, ranges: dict, layers: list[str], activation="uint8", per_channel=True,
            extra_ops=False) -> Path:
    """infopt's QDQ writer with one setting changed."""
    from onnxruntime.quantization import QuantType
    from onnxruntime.quantization.calibrate import CalibrationMethod, TensorsData
    from onnxruntime.quantization.qdq_quantizer import QDQQuantizer
    from onnxruntime.quantization.quant_utils import load_model_with_shape_infer

    model = load_model_with_shape_infer(fp32)
    tensors = TensorsData(CalibrationMethod.MinMax, {k: (np.float32(lo), np.float32(hi)) for k, (lo, hi) in ranges.items()})
    ops = ["Conv", "MatMul", "Gemm"] + (["Relu", "MaxPool", "Flatten", "Reshape", "AveragePool", "Add"] if extra_ops else [])
    nodes = [n.name for n in model.graph.node if n.op_type in ops] if extra_ops else layers
    act = QuantType.QInt8 if activation == "int8" else QuantType.QUInt8
    quantizer = QDQQuantizer(model, per_channel, False, QuantType.QInt8, act, tensors, nodes, [], ops,
                             {"WeightSymmetric": True, "ActivationSymmetric": False,
                              "OpTypesToExcludeOutputQuantization": [] if extra_ops else ["MatMul", "Gemm"]})
    quantizer.quantize_model()
    import onnx

    onnx.save(quantizer.model.model, str(out))
    return out


def all_ranges(fp32: Path, calib: np.ndarray) -> dict:
    """Min/max of every float tensor on the calibration images (what the variants with more QDQ need)."""
    import onnx
    from onnx import helper

    model = onnx.load(str(fp32))
    names = [o for n in model.graph.node for o in n.output]
    known = {o.name for o in model.graph.output}
    for name in names:
        if name not in known:
            model.graph.output.append(helper.make_empty_tensor_value_info(name))
    probe = Path(tempfile.mkdtemp()) / "probe.onnx"
    onnx.save(model, str(probe))
    sess = session(probe)
    outs = [o.name for o in sess.get_outputs()]
    values = sess.run(outs, {"x": calib})
    ranges = {name: (float(min(v.min(), 0)), float(max(v.max(), 0))) for name, v in zip(outs, values)
              if isinstance(v, np.ndarray) and v.dtype == np.float32}
    ranges["x"] = (float(min(calib.min(), 0)), float(max(calib.max(), 0)))
    return ranges


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--runs", type=int, default=300)
    parser.add_argument("--markdown", type=Path)
    args = parser.parse_args()

    from examples.train import train_digits
    from infopt.core.logs import quiet_third_party
    from infopt.quantize import onnx_int8

    quiet_third_party()
    model, data = train_digits()
    (xtr, _), (xte, yte) = data["train"], data["val"]
    work = Path(tempfile.mkdtemp(prefix="profile-int8-"))
    np.savez(work / "calib.npz", x=xtr[:512])
    common = {"inputs": ["x:float32[batch,1,8,8]"], "batch_sizes": [1, args.batch], "progress": False, "target": "cpu"}
    fp32 = infopt.build(model, output=work / "fp32", recipe="fp32-onnxruntime", **common)
    # choose: first: the INT8 graph the fallback confirmed, before the pass times its variants against FP32
    int8 = infopt.build(model, output=work / "int8", recipe="int8-onnxruntime", calibration=str(work / "calib.npz"),
                        val=str(work / "calib.npz"), calib_samples=128, max_drift="top1=0.995",
                        pass_options={"quantize_int8": {"choose": "first"}}, **common)
    # the quantizers take the plain export (standard ONNX ops); the shipped FP32 model has ONNX Runtime's
    # FusedConv, which no quantizer knows
    plain_recipe = {"name": "fp32-plain", "precision": "fp32", "backend": "onnxruntime", "description": "export only",
                    "passes": [{"name": n} for n in ("capture", "remove_noops", "fold_batchnorm", "onnx_export")],
                    "validation": {"drift": {"min_mean_cosine": 0.99}}}
    (work / "fp32-plain.yaml").write_text(yaml.safe_dump(plain_recipe))
    plain = infopt.build(model, output=work / "plain", recipe=str(work / "fp32-plain.yaml"), **common)
    fp32_path, int8_path = fp32.output_dir / "model/model.onnx", int8.output_dir / "model/model.onnx"
    plain_path = plain.output_dir / "model/model.onnx"
    calib = xtr[:128]
    ranges = all_ranges(plain_path, calib)
    import onnx

    layers = [x.node for x in onnx_int8.layers(onnx.load(str(plain_path)))]
    models = {"infopt fp32": fp32_path, "infopt int8 static (every layer INT8, ORT-optimized)": int8_path,
              "ORT quantize_static defaults": ort_static_defaults(plain_path, work / "ort_static.onnx", calib)}
    for label, settings in VARIANTS.items():
        models[label] = variant(plain_path, work / f"variant{len(models)}.onnx", ranges, layers, **settings)

    feed = {"x": np.ascontiguousarray(xte[:args.batch])}
    rows, ops_seen, profiles = [], set(), {}
    for label, path in models.items():
        by_op, times = profile(path, feed, args.runs, work)
        profiles[label] = by_op
        ops_seen |= set(by_op)
        sess = session(path)
        pred = np.concatenate([sess.run(None, {"x": xte[i:i + 32]})[0] for i in range(0, len(xte), 32)]).argmax(1)
        rows.append((label, np.percentile(times, 50), np.percentile(times, 90), np.percentile(times, 99),
                     float((pred == yte).mean())))
    base = rows[0][1]
    lines = [f"DigitsCNN, batch {args.batch}: {args.runs} timed runs per model after 20 warm-up runs", "",
             "| model | p50 ms | p90 ms | p99 ms | vs infopt fp32 (p50) | top-1 |", "| --- | --- | --- | --- | --- | --- |"]
    lines += [f"| {label} | {p50:.3f} | {p90:.3f} | {p99:.3f} | {base / p50:.2f}x | {top1:.4f} |"
              for label, p50, p90, p99, top1 in rows]
    ops = sorted(ops_seen, key=lambda op: -max(p.get(op, 0) for p in profiles.values()))
    lines += ["", "Microseconds per run by the op ORT ran (after its fusions), from its profiler:", "",
              "| model | " + " | ".join(ops) + " |", "| --- |" + " --- |" * len(ops)]
    lines += [f"| {label} | " + " | ".join(f"{p[op]:.1f}" if op in p else "-" for op in ops) + " |"
              for label, p in profiles.items()]
    lines += ["", *[f"- {line}" for line in environment()]]
    publish("\n".join(lines), args.markdown)


if __name__ == "__main__":
    main()
