"""Question: at an encoder's deployed size, how long does a default build take and how much memory does it
need, beside the bare export-plus-optimizer script a peer runs on the same folder?

The model is a folder with BERT-large's config (24 layers, hidden 1024, 16 heads, 335M parameters, 1.3 GB of
fp32 weights) and random weights, written with ``save_pretrained``. Each build runs as a user runs it, in its
own process, with an empty cache folder (nothing exported or compiled before):

- ``infopt build FOLDER --dim batch=1:8:32 --dim seq=1:128:512``: the default build (every CPU candidate
  that is worth building, validated, timed, emitted for the servers);
- the bare script: ``torch.onnx.export`` (dynamo) of the folder's ``BertModel``, ONNX Runtime's transformer
  optimizer (``optimize_model(model_type="bert")``) and its save. It validates, times and emits nothing.

For each: wall time, the peak resident memory of the process tree (sampled every 0.1 s), the model file's
bytes and, for infopt, its longest steps. Then the two models are timed side by side in one ONNX Runtime
process (``validators/timing.measure``, ABBA blocks, the bare model as the baseline) at batch 1 and 8,
sequence 128: p50/p90/p99 and the ratio with its interval.

    python benchmarks/bench_encoder_scale.py [--markdown benchmarks/results/encoder_scale.md]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.bench_scale import infopt_steps, judging_share, run_measured  # noqa: E402
from benchmarks.common import RESULTS, environment, publish  # noqa: E402

INFOPT = Path(sys.executable).with_name("infopt")
BERT_LARGE = {"hidden_size": 1024, "num_hidden_layers": 24, "num_attention_heads": 16, "intermediate_size": 4096,
              "vocab_size": 30522, "max_position_embeddings": 512}
DIMS = ["--dim", "batch=1:8:32", "--dim", "seq=1:128:512"]

BARE = textwrap.dedent("""
    import sys, torch
    from pathlib import Path
    from transformers import AutoModel
    from onnxruntime.transformers.optimizer import optimize_model
    folder, out = sys.argv[1], Path(sys.argv[2])
    out.mkdir(parents=True, exist_ok=True)
    model = AutoModel.from_pretrained(folder, attn_implementation="eager").eval()
    ids = torch.ones(1, 128, dtype=torch.int64)
    batch, seq = torch.export.Dim("batch", max=32), torch.export.Dim("seq", max=512)
    torch.onnx.export(model, (ids, ids, ids), str(out / "model.onnx"), dynamo=True,
                      input_names=["input_ids", "attention_mask", "token_type_ids"], output_names=["last_hidden_state"],
                      dynamic_shapes=({0: batch, 1: seq}, {0: batch, 1: seq}, {0: batch, 1: seq}))
    optimize_model(str(out / "model.onnx"), model_type="bert", num_heads=0, hidden_size=0).save_model_to_file(
        str(out / "optimized.onnx"), use_external_data_format=True)
""")


def write_folder(folder: Path) -> int:
    import torch
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    BertModel(BertConfig(**BERT_LARGE)).save_pretrained(folder)
    return sum(p.stat().st_size for p in folder.glob("*.safetensors"))


def file_bytes(model: Path) -> int:
    return sum(p.stat().st_size for p in model.parent.iterdir() if p.name.startswith(model.name))


def side_by_side(infopt_model: Path, bare_model: Path) -> list[str]:
    """Both models in one process, ABBA blocks, the bare one the baseline: a table row per batch size."""
    import numpy as np

    from infopt.runtime.backends.onnxruntime import OrtRunner
    from infopt.validators.timing import measure

    runners = {"bare": OrtRunner(bare_model).run, "infopt": OrtRunner(infopt_model).run}
    rng = np.random.default_rng(0)
    feeds = {b: {"input_ids": rng.integers(0, BERT_LARGE["vocab_size"], (b, 128)).astype(np.int64),
                 "attention_mask": np.ones((b, 128), np.int64), "token_type_ids": np.zeros((b, 128), np.int64)}
             for b in (1, 8)}
    found = measure(runners, feeds, warmup=1, iterations=10, seconds=20.0, min_iterations=6, baseline="bare")
    rows = []
    for b in feeds:
        stats = {s.runner: s for s in found.stats if s.batch == b}
        ratio = next(r for r in found.ratios["infopt"] if r.batch == b)
        rows.append(f"| {b} | " + " | ".join(f"{stats[n].p50_ms:.0f} / {stats[n].p90_ms:.0f} / {stats[n].p99_ms:.0f}"
                                             for n in ("infopt", "bare"))
                    + f" | {ratio.ratio:.3f} ({ratio.lower:.3f}-{ratio.upper:.3f}, {2 * ratio.confidence - 1:.0%}) |")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--limit-s", type=float, default=3600.0, help="a build running longer is killed")
    parser.add_argument("--markdown", type=Path, default=RESULTS / "encoder_scale.md")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="bench-encoder-scale-") as tmp:
        work = Path(tmp)
        folder = work / "bert-large"
        weights = write_folder(folder)
        env = {**os.environ, "INFOPT_CACHE_DIR": str(work / "cache")}
        print("building infopt (default build)", flush=True)
        mine = run_measured([str(INFOPT), "build", str(folder), *DIMS, "-o", str(work / "dist"), "-q"], args.limit_s, env)
        (work / "bare.py").write_text(BARE)
        print("running the bare export + optimizer script", flush=True)
        bare = run_measured([sys.executable, str(work / "bare.py"), str(folder), str(work / "bare")], args.limit_s, env)
        for name, row in (("infopt", mine), ("bare", bare)):
            print(f"  {name}: {row['status']}, {row['wall_s']:.0f} s, peak {row['peak_rss'] / 1e9:.1f} GB", flush=True)
            if row["code"] != 0:
                print(row["stderr"], flush=True)
        manifest = json.loads((work / "dist" / "manifest.json").read_text()) if mine["code"] == 0 else {}
        shipped = work / "dist" / "model" / "model.onnx"
        lines = ["| build | status | wall s | peak RSS GB | model file MB | notes |", "|" + " --- |" * 6]
        lines.append(f"| infopt default | {mine['status']} | {mine['wall_s']:.0f} | {mine['peak_rss'] / 1e9:.1f} | "
                     + (f"{file_bytes(shipped) / 1e6:.0f}" if shipped.exists() else "-")
                     + f" | {manifest.get('recipe', {}).get('name', '-')}; steps: {infopt_steps(work / 'dist')} |")
        lines.append(f"| bare export + optimizer | {bare['status']} | {bare['wall_s']:.0f} | {bare['peak_rss'] / 1e9:.1f} | "
                     + (f"{file_bytes(work / 'bare' / 'optimized.onnx') / 1e6:.0f}" if bare["code"] == 0 else "-")
                     + " | |")
        lines += ["", f"wall ratio infopt / bare: {mine['wall_s'] / bare['wall_s']:.2f}x; peak RSS ratio: "
                      f"{mine['peak_rss'] / bare['peak_rss']:.2f}x; checkpoint {weights / 1e9:.2f} GB fp32; infopt's "
                      f"validation, latency and curve: {judging_share(work / 'dist')} of its steps", ""]
        if manifest:
            lines += ["Candidates: " + "; ".join(f"{c['recipe']} {c['status']}" + (f" ({c['reason']})" if c['reason'] else "")
                                                 for c in manifest["candidates"]), ""]
        if shipped.exists() and bare["code"] == 0:
            lines += ["Latency of the two models, side by side (ms, p50 / p90 / p99; ratio infopt / bare with its "
                      "interval and two-sided confidence):", "",
                      "| batch | infopt | bare | ratio |", "|" + " --- |" * 4,
                      *side_by_side(shipped, work / "bare" / "optimized.onnx")]
    text = "\n".join(["## An encoder at its deployed size: BERT-large, default build against the bare script (CPU)", "",
                      "`python benchmarks/bench_encoder_scale.py`", "", *lines, "",
                      *(f"- {line}" for line in environment())])
    publish(text, args.markdown)


if __name__ == "__main__":
    main()
