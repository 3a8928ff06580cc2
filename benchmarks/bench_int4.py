"""Question: on CPU, is the INT4 weight-only ONNX model (ONNX Runtime's MatMulNBits) faster and
smaller than FP32, and what does it cost in accuracy?

Two parts, each timed in one run with every runner in its own warm-up and timed block:

1. ``layers``, one LLM-shaped Linear ``y = x @ W.T`` (no bias), fp32 activations ``x`` ``[M, K]``,
   M in 1, 4, 16, 64 and (N, K) in (4096, 4096), (4096, 11008), (11008, 4096) (Llama-7B's attention
   and MLP projections), with a random ``W`` (normal, std ``1 / sqrt(K)``):

   - eager fp32: ``torch.nn.functional.linear(x, W)`` (the baseline);
   - onnxruntime fp32: ``nn.Linear`` holding ``W``, ``torch.export.export``-ed and lowered with
     infopt's ``export_onnx`` (the exporter emits it as one Gemm on an fp32 initializer);
   - onnxruntime int4: ``Int4Linear(rtn_quantize(W, 128, False))`` (asymmetric RTN, group size
     128) in a module, exported and lowered the same way, which turns it into one
     ``com.microsoft::MatMulNBits``; once with ``accuracy_level`` 0 (the dequantized weight times fp32
     activations) and once with 4 (activations quantized to int8 per block, int8 dot products).

   Each ONNX model is exported once with a dynamic M. GB/s is the weight bytes one call reads
   divided by its p50: 4 bytes per weight for fp32; for INT4 the MatMulNBits initializers (4-bit
   codes, fp32 scales, zero points packed two per byte). Activations and output are not counted.
   Accuracy is the relative error ``||y - y_eager|| / ||y_eager||`` at that M. No cache is flushed
   between calls: a layer's INT4 weights (9-24 MB) can stay in a large L3 cache, fp32's cannot.

2. ``minilm``, the real all-MiniLM-L6-v2 sentence encoder (seq 64), built with
   ``infopt.build(precision="fp32", backend="onnxruntime")`` and twice with ``infopt.build(precision="int4",
   backend="onnxruntime")`` (calibrated on the calibration sentences, so GPTQ), with the
   ``onnx_export`` pass's ``int4_accuracy_level`` at 0 and at 4; the builds validate on the
   calibration sentences. Each is loaded with ``result.load(threads=cores)`` and timed at batch 1 and
   16 against eager FP32. Accuracy: cosine similarity of each runner's embeddings to eager FP32 over
   the held-out evaluation sentences that no build sees.

Every ONNX Runtime session: CPUExecutionProvider, all graph optimizations, ``intra_op_num_threads``
= cores; eager PyTorch runs on torch's own thread pool.

    python benchmarks/bench_int4.py [--iterations 200] [--markdown benchmarks/results/int4.md]
    python benchmarks/bench_int4.py --quick [--models layers]     # a fast check; writes no results file
"""

from __future__ import annotations

import inspect
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import infopt  # noqa: E402
from benchmarks.common import arguments, environment, minilm_eval, publish, timed  # noqa: E402
from infopt.runtime.backends.onnxruntime import OrtRunner  # noqa: E402
from infopt.runtime.runner import TorchRunner  # noqa: E402

MS = (1, 4, 16, 64)
SHAPES = ((4096, 4096), (4096, 11008), (11008, 4096))
GROUP_SIZE = 128
BATCHES = (1, 16)
EAGER, ORT32 = "eager fp32", "onnxruntime fp32"
INT4 = {0: "onnxruntime int4 (accuracy_level 0)", 4: "onnxruntime int4 (accuracy_level 4)"}


def file_bytes(path: Path) -> int:
    """The ONNX file and its external data file, if it has one."""
    data = path.with_name(path.name + ".data")
    return path.stat().st_size + (data.stat().st_size if data.exists() else 0)


def op_types(path: Path) -> str:
    """The matrix-product ops in an ONNX file, with counts."""
    from collections import Counter

    import onnx

    model = onnx.load(str(path), load_external_data=False)
    counts = Counter(n.op_type for n in model.graph.node)
    wanted = ("Gemm", "MatMul", "FusedMatMul", "MatMulNBits", "Attention")
    return ", ".join(f"{op} x{counts[op]}" for op in wanted if counts[op]) or "none"


def last_level_cache() -> tuple[str, int] | None:
    """(name, bytes) of the largest CPU cache Linux lists, or None where it lists none."""
    best = None
    for index in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*"):
        try:
            level = int((index / "level").read_text())
            text = (index / "size").read_text().strip()
        except (OSError, ValueError):
            continue
        size = int(text[:-1]) * {"K": 1 << 10, "M": 1 << 20}[text[-1]] if text[-1] in "KM" else int(text)
        if best is None or size > best[1]:
            best = (f"L{level}", size)
    return best


class Int4Layer(nn.Module):
    """One Linear held the way infopt's INT4 pass holds it."""

    def __init__(self, weight: torch.Tensor):
        from infopt.quantize.int4_format import Int4Linear
        from infopt.quantize.rtn import rtn_quantize

        super().__init__()
        self.linear = Int4Linear(rtn_quantize(weight, GROUP_SIZE, False), bias=None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x)


def lower(module: nn.Module, K: int, path: Path, accuracy_level: int = 0) -> Path:
    """torch.export with a dynamic M, then infopt's own ONNX lowering."""
    from infopt.passes.lower.onnx_export import export_onnx

    m = torch.export.Dim("m", min=1, max=max(MS))
    name = next(iter(inspect.signature(module.forward).parameters))
    program = torch.export.export(module.eval(), (torch.randn(4, K),), dynamic_shapes={name: {0: m}})
    export_onnx(program, path, ["x"], ["y"], int4_accuracy_level=accuracy_level)
    return path


def layer_section(args, work: Path, threads: int, notes: list[str]) -> str:
    gen = torch.Generator().manual_seed(0)
    rows = []
    for N, K in SHAPES:
        start = time.perf_counter()
        weight = torch.randn(N, K, generator=gen) / K ** 0.5
        linear = nn.Linear(K, N, bias=False)
        linear.weight.data.copy_(weight)
        paths = {ORT32: lower(linear, K, work / f"linear_{N}x{K}_fp32.onnx")}
        quantized = Int4Layer(weight)
        for level, name in INT4.items():
            paths[name] = lower(quantized, K, work / f"linear_{N}x{K}_int4_acc{level}.onnx", level)
        groups = K // GROUP_SIZE
        weight_bytes = {EAGER: 4 * N * K, ORT32: 4 * N * K}
        for name in INT4.values():
            weight_bytes[name] = N * K // 2 + 4 * N * groups + N * ((groups + 1) // 2)
        notes.append(f"{N}x{K}: exports took {time.perf_counter() - start:.1f} s (quantization included); ops: "
                     + "; ".join(f"{name}: {op_types(p)}" for name, p in paths.items()))

        def eager(feed, w=weight):
            with torch.inference_mode():
                return [F.linear(torch.from_numpy(feed["x"]), w).numpy()]

        runners = {EAGER: eager}
        runners.update({name: OrtRunner(p, threads=threads).run for name, p in paths.items()})
        feeds = {M: {"x": torch.randn(M, K, generator=gen).numpy()} for M in MS}
        stats, note = timed(f"{N}x{K}", runners, feeds, args.warmup, args.iterations, threads)
        notes.append(note)
        for M in MS:
            reference = runners[EAGER](feeds[M])[0]
            by = {s.runner: s for s in stats if s.batch == M}
            for name, s in by.items():
                err = np.linalg.norm(runners[name](feeds[M])[0] - reference) / np.linalg.norm(reference)
                size = "-" if name == EAGER else f"{file_bytes(paths[name]) / 1e6:.1f}"
                rows.append(f"| {N} | {K} | {M} | {name} | {s.p50_ms:.3f} | {s.p90_ms:.3f} | {s.p99_ms:.3f} | "
                            f"{by[EAGER].p50_ms / s.p50_ms:.2f}x | {by[ORT32].p50_ms / s.p50_ms:.2f}x | "
                            f"{weight_bytes[name] / (s.p50_ms / 1e3) / 1e9:.1f} | {weight_bytes[name] / 1e6:.1f} | "
                            f"{size} | {'reference' if name == EAGER else f'{err:.2e}'} |")
        del runners
    cache = last_level_cache()
    if cache:
        name, size = cache
        int4_mb = [(N * K // 2 + 4 * N * (K // GROUP_SIZE) + N * ((K // GROUP_SIZE + 1) // 2)) / 1e6 for N, K in SHAPES]
        notes.append(f"this CPU's {name} cache holds {size / 1e6:.1f} MB: the INT4 weights ({min(int4_mb):.1f}-"
                     f"{max(int4_mb):.1f} MB) {'fit' if max(int4_mb) * 1e6 < size else 'do not all fit'} and the "
                     "fp32 ones do not, so calls repeated on one layer can read INT4 weights from cache (GB/s above "
                     "DRAM bandwidth); in a whole LLM each token streams every layer's weights from DRAM")
    header = ["| N | K | M | runner | p50 ms | p90 ms | p99 ms | vs eager (p50) | vs ORT fp32 (p50) | weight GB/s "
              "| weight MB | file MB | rel. error vs eager |", "| --- " * 13 + "|"]
    return "### One Linear, fp32 activations\n\n" + "\n".join(header + rows)


def int4_note(result) -> str:
    parts = []
    for p in result.manifest.passes:
        if p.name in ("quantize_int4", "onnx_export"):
            parts += p.notes
    return "; ".join(parts)


def verdict(result) -> str:
    checks = result.manifest.validation.verdict.checks
    return "; ".join(f"{c['name']} {c['measured']:.4f}" for c in checks) or "no checks"


def minilm_section(args, work: Path, threads: int, notes: list[str]) -> str:
    from examples.minilm import INPUTS

    ev = minilm_eval(args.quick)
    model, calib = ev.model, ev.calib
    calibration = [{k: v[i:i + 16] for k, v in calib.items()} for i in range(0, len(ev.calib_text), 16)]
    np.savez(work / "minilm_val.npz", **calib)
    common = {"inputs": INPUTS, "dims": ["batch=1:16:64", "seq=1:64:128"], "calibration": calibration,
              "calib_samples": None, "val": str(work / "minilm_val.npz"), "progress": False, "force": True}
    runners = {EAGER: TorchRunner(model, ev.names).run}
    sizes = {}
    builds = [(ORT32, "fp32", "fp32", {})] + [
        (name, "int4", f"int4-acc{level}", {"pass_options": {"onnx_export": {"int4_accuracy_level": level}}})
        for level, name in INT4.items()]
    for name, precision, folder, extra in builds:
        start = time.perf_counter()
        result = infopt.build(model, precision=precision, backend="onnxruntime", output=work / f"minilm-{folder}",
                              **common, **extra)
        seconds = time.perf_counter() - start
        path = result.output_dir / result.manifest.artifacts.model
        sizes[name] = file_bytes(path)
        runners[name] = result.load(threads=threads).run
        notes.append(f"MiniLM {folder} build: {seconds:.0f} s, recipe `{result.manifest.recipe.get('name', '?')}`, "
                     f"verdict {'passed' if result.passed else 'FAILED'} ({verdict(result)})"
                     + (f"; {int4_note(result)}" if precision == "int4" else "") + f"; matrix ops: {op_types(path)}")

    cosine = {name: ev.cosine(run) for name, run in runners.items()}
    notes.append(f"MiniLM accuracy: cosine to eager FP32 over {len(ev.eval_text)} held-out evaluation sentences "
                 f"(seq 64), none used by any build ({len(ev.calib_text)} calibration sentences calibrate GPTQ and "
                 "validate the builds)")
    feeds = {b: ev.feed(b) for b in BATCHES}
    stats, note = timed("MiniLM", runners, feeds, args.warmup, args.iterations, threads)
    notes.append(note)
    fp32_bytes = sum(p.numel() * p.element_size() for p in model.state_dict().values())
    linear_bytes = sum(m.weight.numel() * 4 for m in model.modules() if isinstance(m, nn.Linear))
    embedding_bytes = sum(m.weight.numel() * 4 for m in model.modules() if isinstance(m, nn.Embedding))
    notes.append(f"MiniLM fp32 weights: {fp32_bytes / 1e6:.1f} MB, of which Linear weights {linear_bytes / 1e6:.1f} MB "
                 f"(what INT4 shrinks) and embedding tables {embedding_bytes / 1e6:.1f} MB (kept in fp32)")
    rows = []
    for b in BATCHES:
        by = {s.runner: s for s in stats if s.batch == b}
        for name, s in by.items():
            size = f"{fp32_bytes / 1e6:.1f} (state_dict)" if name == EAGER else f"{sizes[name] / 1e6:.1f}"
            cos = cosine[name]
            rows.append(f"| {b} | {name} | {s.p50_ms:.3f} | {s.p90_ms:.3f} | {s.p99_ms:.3f} | {s.throughput:.0f} | "
                        f"{by[EAGER].p50_ms / s.p50_ms:.2f}x | {by[ORT32].p50_ms / s.p50_ms:.2f}x | {size} | "
                        f"{cos.mean():.4f} ({cos.min():.4f}) |")
    header = ["| batch | runner | p50 ms | p90 ms | p99 ms | samples/s | vs eager (p50) | vs ORT fp32 (p50) "
              "| model MB | cosine to eager: mean (min) |", "| --- " * 10 + "|"]
    return "### all-MiniLM-L6-v2 (seq 64)\n\n" + "\n".join(header + rows)


def main() -> None:
    args = arguments(__doc__, "int4.md", "layers,minilm", "a fast check: 20 iterations, 64 evaluation sentences")
    threads = os.cpu_count() or 1
    started = time.perf_counter()
    notes: list[str] = []
    sections = []
    makers = {"layers": layer_section, "minilm": minilm_section}
    with tempfile.TemporaryDirectory(prefix="bench-int4-") as tmp:
        work = args.workdir or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        for key in args.models.split(","):
            sections.append(makers[key.strip()](args, work, threads, notes))
    elapsed = time.perf_counter() - started
    lines = environment() + [
        f"every ONNX Runtime session: CPUExecutionProvider, all graph optimizations, intra_op_num_threads={threads}",
        f"{args.iterations} timed runs per row after {args.warmup} warm-up runs, in 5 blocks a runner, taking turns "
        f"(p50: the median of the block medians); "
        f"whole run {elapsed:.0f} s (exports and builds included)",
        "vs columns: the other runner's p50 / this row's p50 (above 1: this row is faster)",
        f"INT4 weight bytes: 4-bit codes (N*K/2) + fp32 scales (4*N*K/{GROUP_SIZE}) + 4-bit zero points "
        f"(N*ceil(K/{GROUP_SIZE}/2)), as stored in MatMulNBits; fp32: 4*N*K",
    ] + notes
    publish("\n\n".join(sections) + "\n\n" + "\n".join(f"- {line}" for line in lines), args.markdown)


if __name__ == "__main__":
    main()
