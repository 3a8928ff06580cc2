"""Question: how fast is infopt's FP32 ONNX Runtime artifact against eager PyTorch on CPU?

Trains the example DigitsCNN (scikit-learn digits) and TinyEncoder, builds each with
``infopt.build`` (target cpu, the bundled recipe ``fp32-onnxruntime``), then times eager PyTorch and
the built artifact side by side in one run, each in its own warm-up and timed block at each batch
size. Reports p50/p90/p99 in ms, samples/s and the speedup (eager p50 / artifact p50). Eager FP32 is
the baseline row.

    python benchmarks/bench_fp32_eager_vs_ort.py [--iterations 200] [--markdown out.md]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import infopt  # noqa: E402
from benchmarks.common import environment, publish  # noqa: E402
from examples.train import train_digits, train_encoder  # noqa: E402
from infopt.runtime.runner import TorchRunner  # noqa: E402
from infopt.validators.timing import measure  # noqa: E402

RECIPE = "fp32-onnxruntime"
"""Named, so the row is one recipe: ``backend="onnxruntime"`` also builds ``fp32-onnxruntime-fused``
and ships whichever is faster."""


def cases(workdir: Path):
    cnn, data = train_digits()
    x = data["val"][0]
    result = infopt.build(cnn, example_inputs=(torch.from_numpy(x[:8]),), output=workdir / "cnn", progress=False,
                          val=None, name="digits_cnn", recipe=RECIPE)
    yield "DigitsCNN", cnn, ("x",), result, lambda b: {"x": np.ascontiguousarray(x[:b])}
    enc, edata = train_encoder()
    ids = edata["val"][0]
    result = infopt.build(enc, example_inputs=(torch.from_numpy(ids[:8]),), output=workdir / "enc", progress=False,
                          name="tiny_encoder", recipe=RECIPE)
    yield "TinyEncoder (seq 16)", enc, ("input_ids",), result, lambda b: {"input_ids": np.ascontiguousarray(ids[:b])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--iterations", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--batch-sizes", default="1,32")
    parser.add_argument("--markdown", type=Path, help="also write the table here")
    args = parser.parse_args()
    sizes = [int(s) for s in args.batch_sizes.split(",")]
    lines = ["| model | batch | runner | p50 ms | p90 ms | p99 ms | samples/s | speedup vs eager (p50) | drift max_abs |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    with tempfile.TemporaryDirectory() as tmp:
        for label, module, names, result, feed in cases(Path(tmp)):
            eager = TorchRunner(module.eval(), names)
            built = infopt.load(result.output_dir)
            stats = measure({"eager fp32": eager.run, "infopt onnxruntime fp32": built.run},
                            {b: feed(b) for b in sizes}, warmup=args.warmup, iterations=args.iterations).stats
            drift = result.drift["worst"]["max_abs"]
            for b in sizes:
                rows = [s for s in stats if s.batch == b]
                base = next(s for s in rows if s.runner == "eager fp32")
                for s in rows:
                    lines.append(f"| {label} | {b} | {s.runner} | {s.p50_ms:.3f} | {s.p90_ms:.3f} | {s.p99_ms:.3f} | "
                                 f"{s.throughput:.0f} | {base.p50_ms / s.p50_ms:.2f}x | "
                                 f"{'-' if s is base else f'{drift:.2e}'} |")
    text = "\n".join(lines + [""] + [f"- {e}" for e in environment()]
                     + [f"- {args.iterations} timed runs per row after {args.warmup} warm-up runs, each runner in its own block"])
    publish(text, args.markdown)


if __name__ == "__main__":
    main()
