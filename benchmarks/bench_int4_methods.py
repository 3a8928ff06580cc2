"""Question: which INT4 method keeps the most of all-MiniLM-L6-v2's embedding, and at what cost?

RTN, GPTQ and AWQ (``infopt.quantize.weight_only.quantize_int4``, 4-bit, group size 128,
asymmetric) on the real all-MiniLM-L6-v2, each from the same FP32 model. GPTQ and AWQ calibrate on
the 160 calibration sentences, batched by length as the ``quantize_int4`` pass does; accuracy is
the cosine similarity of each of the 320 held-out evaluation sentences' embedding to eager FP32's
(eager FP32 itself is the baseline row, 1.0). The quantized models run in eager PyTorch here, so
the figures are the methods' own, before any lowering.

    python benchmarks/bench_int4_methods.py [--markdown benchmarks/results/int4_methods.md]
    python benchmarks/bench_int4_methods.py --quick      # 64 evaluation sentences; writes no results file
"""

from __future__ import annotations

import copy
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import arguments, environment, minilm_eval, publish  # noqa: E402
from infopt.core.inputspec import InputSpec  # noqa: E402
from infopt.passes.fx.quantize_int4 import calibration_batches  # noqa: E402
from infopt.quantize.int4_config import Int4Config  # noqa: E402
from infopt.quantize.weight_only import quantize_int4  # noqa: E402
from infopt.runtime.runner import TorchRunner  # noqa: E402

METHODS = ("rtn", "gptq", "awq")


def main() -> None:
    args = arguments(__doc__, "int4_methods.md", "minilm", "64 evaluation sentences, no results file")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    data = minilm_eval(args.quick)
    spec = InputSpec.parse(["input_ids:int64[batch,seq]", "attention_mask:int64[batch,seq]"])
    raw = [{k: v[i:i + 16] for k, v in data.calib.items()} for i in range(0, len(data.calib_text), 16)]
    batches = calibration_batches(raw, spec)
    rows = [("eager fp32", 1.0, 1.0, "-", "-")]
    for method in METHODS:
        model = copy.deepcopy(data.model)
        start = time.perf_counter()
        result = quantize_int4(model, Int4Config(method=method, group_size=128), batches)
        seconds = time.perf_counter() - start
        cosine = data.cosine(TorchRunner(model, data.names).run)
        errors = [row.error for row in result.layers if row.error is not None]
        mean_error = f"{np.mean(errors):.2e}" if errors else "-"
        rows.append((method, float(cosine.mean()), float(cosine.min()), f"{seconds:.1f}", mean_error))
    lines = ["### all-MiniLM-L6-v2, INT4 g128 asymmetric: embedding cosine to eager FP32", "",
             "| method | mean cosine | min cosine | quantize s | mean layer error |", "| --- | --- | --- | --- | --- |"]
    lines += [f"| {m} | {mean:.4f} | {low:.4f} | {sec} | {err} |" for m, mean, low, sec, err in rows]
    lines += ["", f"- {len(data.eval_text)} held-out evaluation sentences (seq 64); GPTQ and AWQ calibrate on "
              f"{len(data.calib_text)} others ({sum(int(b[1].sum()) for b in batches)} tokens)",
              "- layer error: tr(E H E^T) / tr(W H W^T) on the calibration activations, per Linear, averaged",
              *(f"- {line}" for line in environment())]
    publish("\n".join(lines), args.markdown)


if __name__ == "__main__":
    main()
