"""Question: is infopt's INT8 faster than what a user gets from ONNX Runtime or Optimum, and at what accuracy?

For the real all-MiniLM-L6-v2 sentence encoder (held-out sentences padded to seq 64 and to 128, and
rows of 128 real tokens with no padding) and the example DigitsCNN, times in one run, each runner in
its own warm-up and timed block at batch 1 and 32:

1. eager FP32 PyTorch (the baseline);
2. ONNX Runtime FP32: the model of ``infopt.build(recipe="fp32-onnxruntime")``;
3. peers, each on the plain FP32 ONNX this script exports with ``torch.onnx.export(dynamo=True)``
   (no infopt passes, no ORT pre-processing), which is what a user starts from:
   ``quantize_dynamic(plain, out)`` and ``quantize_static(plain, out, reader)`` with every option at
   its default (the reader gives the same calibration samples infopt gets), and, for MiniLM, the
   quantization Optimum's ``optimum-cli onnxruntime quantize --avx512_vnni`` configures
   (``AutoQuantizationConfig.avx512_vnni(is_static=False, per_channel=False)``: dynamic, QOperator,
   u8 activations, symmetric s8 weights per tensor, every op ONNX Runtime's integer registry knows),
   written out here with ONNX Runtime's own quantizer because ``optimum-onnx`` does not install beside
   this project's pinned versions; and, for MiniLM, ONNX Runtime's documented BERT path: the
   ``torch.onnx.export(dynamo=False)`` graph through its transformer optimizer (``--model_type bert``:
   fused Attention, SkipLayerNormalization, BiasGelu), then ``quantize_dynamic``, or ``quant_pre_process``
   and ``quantize_static`` (defaults);
4. for MiniLM, not a peer: Optimum's configuration on the plain export after infopt's
   ``attention_mask_fill`` pass alone (the attention mask filled with -40 instead of float32's lowest),
   to show how much of infopt's lead that one pass is;
5. infopt INT8 static (calibrated) and 6. infopt INT8 dynamic (no calibration data), each as the build
   shipped it (the INT8 variant it measured fastest, or FP32 when no INT8 graph was faster here);
7. for MiniLM, the same two built from the model's folders as a user builds them (``infopt build FOLDER
   --int8 [--calib]``): the sentence-transformers folder (``modules.json``; the build ships the pooled
   embedding) and that folder without its sentence-transformers files (a plain BERT folder; the build ships
   ``last_hidden_state``, mean-pooled over the mask for the accuracy column only).

Accuracy: MiniLM, mean (and min) cosine similarity of the embeddings to eager FP32 over the held-out
evaluation sentences at seq 64, which no build sees (calibration and validation use the calibration
sentences); DigitsCNN, top-1 accuracy on the held-out digits (builds see training images only). Every
ONNX Runtime session has the same options (all graph optimizations, ``intra_op_num_threads`` = cores),
so the infopt models are run from their ``model/model.onnx`` rather than through ``result.load()``;
every session's threads stop spinning between runs (``session.intra_op.allow_spinning=0``), since
the runners take turns on the same cores and an idle session's spinning pool slows the one running
(with spinning, batch-1 head-to-heads on 2 cores had 95% bounds like 0.78-2.44; without, 1.19-1.27).
"vs fastest peer" is the fastest peer's p50 over this row's (above 1: this row is faster).

The blocks above run one after the other, so a machine whose speed drifts over the run skews them. The
second table settles the question the blocks only suggest: each infopt INT8 build against the fastest
peer of its row, timed with the release gate's method (``validators/timing.py``: ABBA trials
of interleaved blocks, the median of the per-trial ratios and its 95% confidence bounds), given as
the peer's time over infopt's (above 1: infopt is faster).

    python benchmarks/bench_int8.py [--iterations 200] [--markdown benchmarks/results/int8.md]
    python benchmarks/bench_int8.py --quick [--models cnn]     # a fast check; writes no results file
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import infopt  # noqa: E402
from benchmarks.common import arguments, environment, minilm_eval, publish, timed  # noqa: E402
from infopt.runtime.backends.onnxruntime import OrtRunner  # noqa: E402
from infopt.runtime.runner import TorchRunner  # noqa: E402
from infopt.validators.timing import paired  # noqa: E402

EAGER, ORT32, ORTQ, ORTS, OPTIMUM, OPTIMUM_FILLED, STATIC, DYNAMIC = (
    "eager fp32", "onnxruntime fp32 (infopt build)", "ORT quantize_dynamic defaults", "ORT quantize_static defaults",
    "Optimum avx512_vnni config", "Optimum config + infopt's mask fill", "infopt int8 static", "infopt int8 dynamic")
ORT_BERT_Q, ORT_BERT_S = ("ORT BERT optimizer + quantize_dynamic", "ORT BERT optimizer + quantize_static")
ST_STATIC, ST_DYNAMIC, HF_STATIC, HF_DYNAMIC = (
    "infopt int8 static, sentence-transformers folder", "infopt int8 dynamic, sentence-transformers folder",
    "infopt int8 static, BERT folder", "infopt int8 dynamic, BERT folder")
FOLDER_BUILDS = (ST_STATIC, ST_DYNAMIC, HF_STATIC, HF_DYNAMIC)
PEERS = (ORTQ, ORTS, OPTIMUM, ORT_BERT_Q, ORT_BERT_S)
FULL_128 = "128, no padding"


def plain_export(module, example: tuple, names: list[str], dynamic: dict, path: Path) -> Path:
    """The FP32 ONNX a user exports by hand: the dynamo exporter, no infopt passes."""
    from infopt.core.logs import quiet_third_party

    with quiet_third_party():
        program = torch.onnx.export(module, example, dynamo=True, input_names=names, output_names=["output"],
                                    dynamic_shapes=dynamic, verbose=False)
        program.save(str(path), external_data=False)
    return path


def ort_defaults(plain: Path, out: Path, tag: str, notes: list[str]) -> Path:
    """quantize_dynamic with its defaults; where that raises, ORT's own pre-processing first, said in the notes."""
    from onnxruntime.quantization import quantize_dynamic
    from onnxruntime.quantization.shape_inference import quant_pre_process

    try:
        quantize_dynamic(str(plain), str(out))
        notes.append(f"{tag} {ORTQ}: quantize_dynamic(plain export) as is")
    except Exception as exc:  # noqa: BLE001 - report whatever ORT raises
        first = str(exc).strip().splitlines()[0]
        pre = plain.with_name(plain.stem + "_preprocessed.onnx")
        quant_pre_process(str(plain), str(pre))
        quantize_dynamic(str(pre), str(out))
        notes.append(f"{tag} {ORTQ}: quantize_dynamic(plain export) raised `{type(exc).__name__}: {first}`; "
                     "the row is quantize_dynamic (defaults) after ORT's `quant_pre_process` (what its warning asks for)")
    return out


def ort_static_defaults(plain: Path, out: Path, calib: dict[str, np.ndarray], extra_options: dict | None = None) -> Path:
    """quantize_static with every default (but ``extra_options``), fed the calibration samples one at a time."""
    from onnxruntime.quantization import CalibrationDataReader, quantize_static

    class Reader(CalibrationDataReader):
        def __init__(self):
            count = len(next(iter(calib.values())))
            self.items = iter([{k: v[i:i + 1] for k, v in calib.items()} for i in range(count)])

        def get_next(self):
            return next(self.items, None)

    quantize_static(str(plain), str(out), Reader(), extra_options=extra_options)
    return out


def torchscript_export(module, example: tuple, names: list[str], dynamic: dict, path: Path) -> Path:
    """The FP32 ONNX of ``torch.onnx.export(dynamo=False)``, the graph ONNX Runtime's transformer optimizer's
    BERT patterns are written for (on the dynamo export it fuses the GELUs only)."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(module, example, str(path), dynamo=False, opset_version=17, input_names=names,
                          output_names=["output"], dynamic_axes={**dynamic, "output": {0: "batch"}})
    return path


def ort_bert_optimized(plain: Path, out: Path, heads: int, hidden: int) -> Path:
    """ONNX Runtime's documented BERT path before quantizing: its transformer optimizer
    (``python -m onnxruntime.transformers.optimizer --model_type bert``: fused attention,
    SkipLayerNormalization, BiasGelu where its patterns match the export)."""
    from onnxruntime.transformers import optimizer

    from infopt.core.logs import quiet_third_party

    with quiet_third_party():
        optimized = optimizer.optimize_model(str(plain), model_type="bert", num_heads=heads, hidden_size=hidden)
    optimized.save_model_to_file(str(out))
    return out


def ort_bert_static(optimized: Path, out: Path, calib: dict[str, np.ndarray]) -> Path:
    """quantize_static (defaults) on the transformer optimizer's graph after ``quant_pre_process``, as ONNX
    Runtime's quantization guide asks."""
    from onnxruntime.quantization.shape_inference import quant_pre_process

    pre = optimized.with_name(optimized.stem + "_preprocessed.onnx")
    # its symbolic shape inference cannot follow the fused graph's dims; ONNX's own shape inference runs
    quant_pre_process(str(optimized), str(pre), skip_optimization=True, skip_symbolic_shape=True)
    return ort_static_defaults(pre, out, calib, {"DefaultTensorType": onnx.TensorProto.FLOAT})


def optimum_avx512_vnni(plain: Path, out: Path) -> Path:
    """What ``AutoQuantizationConfig.avx512_vnni(is_static=False, per_channel=False)`` asks ONNX Runtime for."""
    from onnxruntime.quantization import QuantType, quantize_dynamic
    from onnxruntime.quantization.registry import IntegerOpsRegistry

    quantize_dynamic(str(plain), str(out), per_channel=False, reduce_range=False, weight_type=QuantType.QInt8,
                     op_types_to_quantize=list(IntegerOpsRegistry),
                     extra_options={"WeightSymmetric": True, "ActivationSymmetric": False})
    return out


def mask_filled(plain: Path, out: Path) -> Path:
    """The plain export with infopt's ``attention_mask_fill`` applied (and nothing else): which part of
    infopt's lead is that pass alone, when a peer quantizes the result."""
    import onnx

    from infopt.passes.onnx.attention_mask_fill import fill

    model = onnx.load(str(plain))
    fill(model)
    onnx.save(model, str(out))
    return out


def int8_note(result) -> str:
    """What the build says about its INT8 pass, read off the manifest (layers, fallback, budget, variant)."""
    text = "no quantize_int8 pass in the manifest"
    p = result.manifest.pass_record("quantize_int8")
    if p is not None:
        text = "; ".join(p.notes) or str(p.details)[:200]
    return f"{text} (verdict {'passed' if result.passed else 'FAILED'})"


def builds(model, work: Path, tag: str, common: dict, calib: Path, budget: str, notes: list[str],
           labels: dict[str, str] | None = None) -> dict:
    """infopt's fp32, int8 static and int8 dynamic builds of ``model`` (a module or a folder), each kind given as
    the runner ``labels`` names it (default: all three); runner label -> model.onnx path."""
    kinds = {"fp32": {"recipe": "fp32-onnxruntime"},
             "int8-static": {"precision": "int8", "calibration": str(calib), "max_drift": budget},
             "int8-dynamic": {"precision": "int8", "max_drift": budget}}
    paths = {}
    for kind, runner in (labels or {"fp32": ORT32, "int8-static": STATIC, "int8-dynamic": DYNAMIC}).items():
        start = time.perf_counter()
        result = infopt.build(model, output=work / f"{tag}-{kind}", force=True, progress=False,
                              val=str(calib), **common, **kinds[kind])
        paths[runner] = result.output_dir / "model" / "model.onnx"
        if kind != "fp32":
            notes.append(f"{tag} {runner}: {int8_note(result)}; build {time.perf_counter() - start:.0f} s")
    return paths


def folder_builds(work: Path, calib: dict[str, np.ndarray], common: dict, notes: list[str]) -> dict:
    """``infopt build FOLDER --int8`` (dynamic) and ``--int8 --calib`` (static) from the model's own folders, as a
    user runs them: the sentence-transformers folder the package ships (``modules.json``: the build ships the
    pooled ``sentence_embedding``) and the same folder without its sentence-transformers files (a plain BERT
    folder: the build ships ``last_hidden_state``, which the accuracy column mean-pools over the mask)."""
    import shutil

    from examples.minilm import model_dir

    st = model_dir()
    plain = work / "minilm-bert-folder"
    shutil.rmtree(plain, ignore_errors=True)
    shutil.copytree(st, plain, ignore=shutil.ignore_patterns("modules.json", "1_Pooling", "2_Normalize",
                                                              "config_sentence_transformers.json",
                                                              "sentence_bert_config.json"))
    data = work / "minilm_folder_calib.npz"
    np.savez(data, **calib, token_type_ids=np.zeros_like(calib["input_ids"]))
    return {**builds(str(st), work, "MiniLM-st", common, data, "cosine_mean=0.99", notes,
                     {"int8-static": ST_STATIC, "int8-dynamic": ST_DYNAMIC}),
            **builds(str(plain), work, "MiniLM-bert", common, data, "cosine_mean=0.99", notes,
                     {"int8-static": HF_STATIC, "int8-dynamic": HF_DYNAMIC})}


def folder_runner(path: Path, threads: int):
    """(a timing runner, an embedding runner) for a folder build: the feeds get the folder model's
    ``token_type_ids`` (zeros, as the tokenizer writes them for one sentence); a ``last_hidden_state`` output is
    mean-pooled over the mask for the accuracy column only, so the timing runs the model alone."""
    session = OrtRunner(path, threads=threads, spinning=False)

    def run(feed: dict[str, np.ndarray]) -> list[np.ndarray]:
        return session.run({**feed, "token_type_ids": np.zeros_like(feed["input_ids"])})

    def embed(feed: dict[str, np.ndarray]) -> list[np.ndarray]:
        out = run(feed)[0]
        if out.ndim == 3:
            mask = feed["attention_mask"][..., None].astype(out.dtype)
            out = (out * mask).sum(1) / np.maximum(mask.sum(1), 1e-9)
        return [out]

    return run, embed


def minilm_case(work: Path, quick: bool, notes: list[str]):
    from examples.minilm import INPUTS, tokenize

    ev = minilm_eval(quick)
    calib = ev.calib
    np.savez(work / "minilm_calib.npz", **calib)
    common = {"inputs": INPUTS, "dims": ["batch=1:32:64", "seq=1:64:128"], "batch_sizes": [1, 32],
              "calib_samples": 32 if quick else 128}
    paths = builds(ev.model, work, "MiniLM", common, work / "minilm_calib.npz", "cosine_mean=0.99", notes)
    folder_common = {k: v for k, v in common.items() if k != "inputs"}
    paths.update(folder_builds(work, calib, folder_common, notes))
    example = (torch.from_numpy(calib["input_ids"][:2]), torch.from_numpy(calib["attention_mask"][:2]))
    dyn = {"input_ids": {0: "batch", 1: "seq"}, "attention_mask": {0: "batch", 1: "seq"}}
    plain = plain_export(ev.model, example, list(ev.names), dyn, work / "minilm_plain.onnx")
    paths[ORTQ] = ort_defaults(plain, work / "minilm_ort_dynamic.onnx", "MiniLM", notes)
    paths[ORTS] = ort_static_defaults(plain, work / "minilm_ort_static.onnx", {k: v[:32 if quick else 128] for k, v in calib.items()})
    paths[OPTIMUM] = optimum_avx512_vnni(plain, work / "minilm_optimum.onnx")
    config = ev.model.bert.config
    scripted = torchscript_export(ev.model, example, list(ev.names), dyn, work / "minilm_torchscript.onnx")
    optimized = ort_bert_optimized(scripted, work / "minilm_ort_bert.onnx", config.num_attention_heads, config.hidden_size)
    from onnxruntime.quantization import quantize_dynamic

    # the fused contrib ops have no ONNX type inference: ONNX Runtime's error asks for DefaultTensorType
    quantize_dynamic(str(optimized), str(work / "minilm_ort_bert_dynamic.onnx"),
                     extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT})
    paths[ORT_BERT_Q] = work / "minilm_ort_bert_dynamic.onnx"
    paths[ORT_BERT_S] = ort_bert_static(optimized, work / "minilm_ort_bert_static.onnx",
                                        {k: v[:32 if quick else 128] for k, v in calib.items()})
    filled = mask_filled(plain, work / "minilm_plain_mask_filled.onnx")
    paths[OPTIMUM_FILLED] = optimum_avx512_vnni(filled, work / "minilm_optimum_mask_filled.onnx")
    at_128 = tokenize(ev.eval_text[:32], 128)
    # every row 128 real tokens (held-out sentences run together): no padding, so no masked score
    text = ev.eval_text
    full_128 = tokenize([" ".join(text[(row * 12 + i) % len(text)] for i in range(12)) for row in range(32)], 128)
    assert full_128["attention_mask"].all(), "the run-together sentences are shorter than 128 tokens"
    sources = {64: ev.evaluation, 128: at_128, FULL_128: full_128}

    def feeds(seq, batch: int):
        return {k: np.ascontiguousarray(v[:batch]) for k, v in sources[seq].items()}

    def accuracy(run):
        cos = ev.cosine(run)
        return f"cosine mean {cos.mean():.4f} (min {cos.min():.4f})"

    notes.append(f"MiniLM accuracy: over {len(ev.eval_text)} held-out evaluation sentences (seq 64), "
                 f"none used by any build ({len(ev.calib_text)} calibration sentences calibrate and validate)")
    return "all-MiniLM-L6-v2", ev.model, ev.names, paths, {64: feeds, 128: feeds, FULL_128: feeds}, accuracy


def cnn_case(work: Path, quick: bool, notes: list[str]):
    from examples.train import train_digits

    model, data = train_digits()
    (xtr, _), (xte, yte) = data["train"], data["val"]
    np.savez(work / "digits_calib.npz", x=xtr[:512])
    common = {"inputs": ["x:float32[batch,1,8,8]"], "batch_sizes": [1, 32], "calib_samples": 32 if quick else 128}
    paths = builds(model, work, "DigitsCNN", common, work / "digits_calib.npz", "top1=0.995", notes)
    plain = plain_export(model, (torch.from_numpy(xtr[:2]),), ["x"], {"x": {0: "batch"}}, work / "cnn_plain.onnx")
    paths[ORTQ] = ort_defaults(plain, work / "cnn_ort_dynamic.onnx", "DigitsCNN", notes)
    paths[ORTS] = ort_static_defaults(plain, work / "cnn_ort_static.onnx", {"x": xtr[:32 if quick else 128]})

    def feed(_seq, b):
        return {"x": np.ascontiguousarray(xte[:b])}

    def accuracy(run):
        pred = np.concatenate([run({"x": xte[i:i + 32]})[0] for i in range(0, len(xte), 32)]).argmax(1)
        return f"top-1 {(pred == yte).mean():.4f}"

    notes.append(f"DigitsCNN accuracy: top-1 on {len(xte)} held-out digits; builds calibrate and validate "
                 f"on 512 training images")
    return "DigitsCNN", model, ("x",), paths, {None: feed}, accuracy


def main() -> None:
    args = arguments(__doc__, "int8.md", "minilm,cnn", "a fast check: 20 iterations, 64 evaluation sentences, 32 calibration samples",
                     extra=lambda parser: parser.add_argument("--trials", type=int, default=9,
                                                              help="ABBA trials per head-to-head row"))
    threads = os.cpu_count() or 1
    started = time.perf_counter()
    lines = ["| model | seq | batch | runner | p50 ms | p90 ms | p99 ms | samples/s (p50) | vs eager (p50) "
             "| vs fastest peer (p50) | accuracy |", "| --- " * 11 + "|"]
    notes: list[str] = []
    duels = ["| model | seq | batch | infopt | fastest peer | infopt ms | peer ms | peer / infopt (95% bounds) |",
             "| --- " * 8 + "|"]
    makers = {"minilm": minilm_case, "cnn": cnn_case}
    with tempfile.TemporaryDirectory(prefix="bench-int8-") as tmp:
        work = args.workdir or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        for key in args.models.split(","):
            label, module, names, paths, feeds, accuracy = makers[key](work, args.quick, notes)
            runners = {EAGER: TorchRunner(module.eval(), names).run}
            for name in (ORT32, *PEERS, OPTIMUM_FILLED, STATIC, DYNAMIC):
                if name in paths:
                    runners[name] = OrtRunner(paths[name], threads=threads, spinning=False).run
            acc = {name: accuracy(run) for name, run in runners.items()}
            for name in FOLDER_BUILDS:
                if name in paths:
                    runners[name], embed = folder_runner(paths[name], threads)
                    acc[name] = accuracy(embed)
            for seq, feed in feeds.items():
                for b in (1, 32):
                    iterations = args.iterations if b == 1 else max(args.iterations // 10, 10)
                    stats, note = timed(f"{label}{f' seq {seq}' if seq else ''} batch {b}", runners, {b: feed(seq, b)},
                                        max(args.warmup // (1 if b == 1 else 10), 2), iterations, threads)
                    notes.append(note)
                    rows = {s.runner: s for s in stats}
                    fastest_peer = min(rows[p].p50_ms for p in PEERS if p in rows)
                    for s in rows.values():
                        lines.append(f"| {label} | {seq or '-'} | {b} | {s.runner} | {s.p50_ms:.3f} | {s.p90_ms:.3f} | "
                                     f"{s.p99_ms:.3f} | {b / (s.p50_ms / 1e3):.0f} | {rows[EAGER].p50_ms / s.p50_ms:.2f}x | "
                                     f"{fastest_peer / s.p50_ms:.2f}x | {acc[s.runner]} |")
                    peer = min((p for p in PEERS if p in rows), key=lambda p: rows[p].p50_ms)
                    for mine in (STATIC, DYNAMIC, *FOLDER_BUILDS):
                        if mine not in runners:
                            continue
                        r = paired(runners[mine], runners[peer], {b: feed(seq, b)}, trials=args.trials,
                                   runs=3 if b == 1 else 1, warmup=2)[0]
                        duels.append(f"| {label} | {seq or '-'} | {b} | {mine} | {peer} | {r.candidate_p50_ms:.3f} | "
                                     f"{r.baseline_p50_ms:.3f} | {1 / r.ratio:.2f}x ({1 / r.upper:.2f}-{1 / r.lower:.2f}) |")
    elapsed = time.perf_counter() - started
    text = "\n".join(lines + [""] + duels + [""] + [f"- {e}" for e in environment()] + [
        f"- every ONNX Runtime session: CPUExecutionProvider, all graph optimizations, intra_op_num_threads={threads}, "
        "allow_spinning=0 (the runners take turns on the same cores: a spinning idle pool slows the one running)",
        "- peers run on this script's own `torch.onnx.export(dynamo=True)` FP32 export",
        f"- {args.iterations} timed runs per row at batch 1 and {max(args.iterations // 10, 10)} at batch 32, after "
        f"warm-up runs, in 5 blocks a runner, taking turns "
        f"(p50: the median of the block medians); whole run {elapsed:.0f} s (builds included)"] + [f"- {n}" for n in notes])
    publish(text, args.markdown)


if __name__ == "__main__":
    main()
