"""Question: which backend is fastest on this CPU, and what does fusion buy?

For the real all-MiniLM-L6-v2 sentence encoder (seq 64) and the example DigitsCNN, times in one run,
each runner in its own warm-up and timed block at batch 1 and 32:

1. eager FP32 PyTorch (the baseline);
2. ONNX Runtime, unfused: the ``model/model.onnx`` of ``infopt.build(recipe=fp32-onnxruntime)``;
3. ONNX Runtime, fused: the same with recipe ``fp32-onnxruntime-fused`` (onnxscript's transformer
   fusion into ONNX Runtime's Attention, SkipLayerNormalization and BiasGelu before ONNX Runtime's
   own optimizer); what it fused is read from the build's manifest;
4. AOTInductor: the ``model/model.pt2`` of ``infopt.build(recipe=fp32-inductor)``.

Every ONNX Runtime session has the same options (all graph optimizations, ``intra_op_num_threads`` =
cores); eager PyTorch and the AOTInductor package run on torch's own thread pool. Accuracy against
eager FP32: MiniLM, cosine similarity of the embeddings over the held-out evaluation sentences that no
build sees (builds validate on the calibration sentences); DigitsCNN, max abs difference of the
logits and top-1 agreement over the held-out digits (builds validate on training images).

    python benchmarks/bench_backends.py [--iterations 200] [--markdown benchmarks/results/backends.md]
    python benchmarks/bench_backends.py --quick [--models cnn]     # a fast check; writes no results file
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import infopt  # noqa: E402
from benchmarks.common import arguments, environment, minilm_eval, publish, timed  # noqa: E402
from infopt.core.recipe import bundled_recipes  # noqa: E402
from infopt.runtime.backends.inductor import AotiRunner  # noqa: E402
from infopt.runtime.backends.onnxruntime import OrtRunner  # noqa: E402
from infopt.runtime.runner import TorchRunner  # noqa: E402

EAGER, UNFUSED, FUSED, INDUCTOR = ("eager fp32", "onnxruntime unfused", "onnxruntime fused", "aotinductor")
RECIPES = {UNFUSED: "fp32-onnxruntime", FUSED: "fp32-onnxruntime-fused", INDUCTOR: "fp32-inductor"}
BATCHES = (1, 32)


def pass_record(result, name: str) -> dict | None:
    record = result.manifest.pass_record(name)
    return None if record is None else record.to_json()


def builds(module, work: Path, tag: str, common: dict, notes: list[str]) -> dict[str, Path]:
    """One infopt build per recipe; runner name -> the model file the build emitted."""
    recipes = bundled_recipes()
    paths = {}
    for runner, stem in RECIPES.items():
        start = time.perf_counter()
        result = infopt.build(module, recipe=recipes[stem], output=work / f"{tag}-{stem}", force=True, progress=False,
                              **common)
        seconds = time.perf_counter() - start
        paths[runner] = result.output_dir / result.manifest.artifacts.model
        passes = ", ".join(f"{p.name} {p.seconds:.1f} s" for p in result.manifest.passes if p.seconds >= 0.5)
        notes.append(f"{tag} build `{stem}`: {seconds:.1f} s in all (validation included; slowest passes: "
                     f"{passes or 'none over 0.5 s'}); verdict {'passed' if result.passed else 'FAILED'}")
        fusion = pass_record(result, "transformer_fusion")
        if fusion is not None:
            notes.append(f"{tag} `{stem}` transformer_fusion: {'; '.join(fusion.get('notes', []))}"
                         + ("" if fusion.get("changed") else " (the model is left as it is)"))
        ort = pass_record(result, "ort_optimize")
        if ort is not None:
            notes.append(f"{tag} `{stem}` ort_optimize: {'; '.join(ort.get('notes', []))}")
    return paths


def minilm_case(work: Path, quick: bool, notes: list[str]):
    from examples.minilm import INPUTS

    ev = minilm_eval(quick)
    np.savez(work / "minilm_val.npz", **ev.calib)
    common = {"inputs": INPUTS, "dims": ["batch=1:32:64", "seq=1:64:128"], "batch_sizes": list(BATCHES),
              "val": str(work / "minilm_val.npz")}
    paths = builds(ev.model, work, "MiniLM", common, notes)

    def accuracy(run):
        cos = ev.cosine(run)
        return f"min cosine {cos.min():.7f} (1 - min {1 - cos.min():.1e}; mean {cos.mean():.7f})"

    notes.append(f"MiniLM accuracy: cosine to eager FP32 over {len(ev.eval_text)} held-out evaluation sentences "
                 f"(seq 64), none used by any build ({len(ev.calib_text)} calibration sentences validate the builds)")
    return "all-MiniLM-L6-v2 (seq 64)", ev.model, ev.names, paths, ev.feed, accuracy, lambda runners: []


def cnn_case(work: Path, quick: bool, notes: list[str]):
    from examples.train import train_digits

    model, data = train_digits()
    (xtr, _), (strided, yte) = data["train"], data["val"]
    # The held-out array is C-contiguous but its size-1 channel dim has a 4-byte stride, not the 256 of a fresh
    # array (an AOTInductor package reads inputs by their strides): rows use fresh copies, a note the array as is.
    xte = np.array(strided, order="C", copy=True)
    np.savez(work / "digits_val.npz", x=xtr[:512])
    common = {"inputs": ["x:float32[batch,1,8,8]"], "batch_sizes": list(BATCHES), "val": str(work / "digits_val.npz")}
    paths = builds(model, work, "DigitsCNN", common, notes)

    def feed(b):
        return {"x": np.array(xte[:b], order="C", copy=True)}

    def logits(run, x=xte):
        return np.concatenate([run({"x": x[i:i + 32]})[0] for i in range(0, len(x), 32)])

    reference = logits(TorchRunner(model, ("x",)).run)

    def compare(out):
        agree = (out.argmax(1) == reference.argmax(1)).mean()
        return (f"max abs {np.abs(out - reference).max():.2e}, top-1 agreement {agree:.4f} "
                f"(top-1 {(out.argmax(1) == yte).mean():.4f})")

    def accuracy(run):
        return compare(logits(run))

    def as_given(runners):
        return [f"DigitsCNN fed the held-out array as is (byte strides {strided.strides}, a fresh copy's "
                f"{xte.strides}), against eager on fresh copies: "
                + "; ".join(f"{name} {compare(logits(run, strided)).split(' (')[0]}" for name, run in runners.items())]

    notes.append(f"DigitsCNN accuracy: logits against eager FP32 on {len(xte)} held-out digits (fresh C-ordered "
                 "copies); builds validate on 512 training images")
    return "DigitsCNN", model, ("x",), paths, feed, accuracy, as_given


def main() -> None:
    args = arguments(__doc__, "backends.md", "cnn,minilm", "a fast check: 20 iterations, 64 evaluation sentences")
    threads = os.cpu_count() or 1
    started = time.perf_counter()
    sections: list[str] = []
    notes: list[str] = []
    makers = {"minilm": minilm_case, "cnn": cnn_case}
    with tempfile.TemporaryDirectory(prefix="bench-backends-") as tmp:
        work = args.workdir or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        for key in args.models.split(","):
            label, module, names, paths, feed, accuracy, extra = makers[key.strip()](work, args.quick, notes)
            runners = {EAGER: TorchRunner(module.eval(), names).run,
                       UNFUSED: OrtRunner(paths[UNFUSED], threads=threads).run,
                       FUSED: OrtRunner(paths[FUSED], threads=threads).run,
                       INDUCTOR: AotiRunner(paths[INDUCTOR], names).run}
            acc = {name: accuracy(run) for name, run in runners.items()}
            notes.extend(extra(runners))
            stats, note = timed(label, runners, {b: feed(b) for b in BATCHES}, args.warmup, args.iterations, threads)
            notes.append(note)
            lines = [f"### {label}", "",
                     "| runner | batch | p50 ms | p90 ms | p99 ms | speedup vs eager (p50) | vs ORT unfused (p50) |",
                     "| --- | --- | --- | --- | --- | --- | --- |"]
            for b in BATCHES:
                rows = {s.runner: s for s in stats if s.batch == b}
                for s in rows.values():
                    lines.append(f"| {s.runner} | {b} | {s.p50_ms:.3f} | {s.p90_ms:.3f} | {s.p99_ms:.3f} | "
                                 f"{rows[EAGER].p50_ms / s.p50_ms:.2f}x | {rows[UNFUSED].p50_ms / s.p50_ms:.2f}x |")
            lines += ["", "| runner | accuracy vs eager fp32 |", "| --- | --- |"]
            lines += [f"| {name} | {'reference' if name == EAGER else text} |" for name, text in acc.items()]
            sections.append("\n".join(lines))
    elapsed = time.perf_counter() - started
    text = "\n\n".join(sections) + "\n\n" + "\n".join([f"- {e}" for e in environment()] + [
        f"- every ONNX Runtime session: CPUExecutionProvider, all graph optimizations, intra_op_num_threads={threads}; "
        f"eager and AOTInductor on torch's pool ({torch.get_num_threads()} threads)",
        f"- {args.iterations} timed runs per row after {args.warmup} warm-up runs, in 5 blocks a runner, taking turns "
        f"(p50: the median of the block medians); "
        f"whole run {elapsed:.0f} s (builds included)",
        "- speedup vs eager = eager p50 / runner p50; vs ORT unfused = ORT unfused p50 / runner p50 (above 1: faster)",
    ] + [f"- {n}" for n in notes])
    publish(text, args.markdown)


if __name__ == "__main__":
    main()
