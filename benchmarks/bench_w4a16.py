"""Question: how close to the GPU's memory bandwidth does infopt's W4A16 kernel run, and how much
faster than torch's fp16 matmul is it?

For ``y = x @ W.T`` with ``x`` fp16 ``[M, K]`` and ``W`` ``[N, K]``, M in 1, 4, 16, 64, 256 and
(N, K) in (4096, 4096), (4096, 11008), (11008, 4096) (Llama-7B's attention and MLP projections),
times in one run, each provider in its own warm-up and timed block:

1. torch fp32: ``x.float() @ W32.T`` (the baseline);
2. torch fp16: ``x @ W16.T`` (cuBLAS);
3. infopt w4a16: ``infopt.kernels.w4a16.w4a16_linear`` on the packed INT4 weight (group size 128,
   asymmetric zeros) that all three share: ``W32`` and ``W16`` are its dequantized values.

Each call is timed with CUDA events after a 256 MiB write that flushes L2, so weights come from HBM
as in decoding, where each layer's weights are read once per token. Bytes moved: weights (int4
codes + fp32 scales + uint8 zeros for w4a16, 2 or 4 bytes per weight otherwise), activations and
output; GB/s is bytes / p50, against the device's copy bandwidth measured here (a 1 GiB
device-to-device copy, read + write bytes). TFLOP/s is ``2*M*N*K`` / p50. Accuracy is the max abs
difference to torch fp32 over the output. ``--models norms`` adds RMSNorm and LayerNorm rows (bf16,
hidden 4096 and 8192): torch fp32 and bf16 eager against the Triton kernels.

    python benchmarks/bench_w4a16.py [--iterations 200] [--markdown benchmarks/results/w4a16.md]
    python benchmarks/bench_w4a16.py --quick [--models w4a16]     # a fast check; writes no results file
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import arguments, environment, publish  # noqa: E402
from infopt.validators.latency import summarize  # noqa: E402

MS = (1, 4, 16, 64, 256)
SHAPES = ((4096, 4096), (4096, 11008), (11008, 4096))
GROUP_SIZE = 128
NORM_ROWS = (1, 256, 4096)
NORM_HIDDEN = (4096, 8192)
FP32, FP16, W4A16 = "torch fp32", "torch fp16", "infopt w4a16"


def gpu_times(fn, warmup: int, iterations: int, flush: torch.Tensor) -> list[float]:
    """Seconds per call from CUDA events around each call, L2 flushed before each."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(iterations)]
    for start, end in events:
        flush.zero_()
        start.record()
        fn()
        end.record()
    torch.cuda.synchronize()
    return [start.elapsed_time(end) / 1e3 for start, end in events]


def copy_bandwidth(flush: torch.Tensor) -> float:
    """GB/s of a 1 GiB device-to-device copy, counting the bytes read and the bytes written."""
    src = torch.ones(1 << 30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    stats = summarize("copy", 1, gpu_times(lambda: dst.copy_(src), 5, 50, flush))
    return 2 * src.numel() / (stats.p50_ms / 1e3) / 1e9


def packed_weight(N: int, K: int, gen: torch.Generator):
    from infopt.quantize.int4_format import dequantize_int4, pack_int4

    groups = K // GROUP_SIZE
    codes = torch.randint(0, 16, (N, K), generator=gen)
    scales = (torch.rand(N, groups, generator=gen) + 0.5) / (5 * K ** 0.5)
    zeros = torch.randint(0, 16, (N, groups), generator=gen).to(torch.uint8)
    qweight = pack_int4(codes)
    weight = dequantize_int4(qweight, scales, zeros, None, GROUP_SIZE)
    return [t.cuda() for t in (qweight, scales, zeros, weight)]


def gemm_rows(args, flush, bandwidth: float, notes: list[str]) -> list[str]:
    from infopt.kernels.w4a16 import w4a16_linear

    gen = torch.Generator().manual_seed(0)
    rows = []
    for N, K in SHAPES:
        qweight, scales, zeros, w32 = packed_weight(N, K, gen)
        w16 = w32.half()
        groups = K // GROUP_SIZE
        for M in MS:
            x = torch.randn(M, K, generator=gen).half().cuda()
            x32 = x.float()
            providers = {
                FP32: (lambda: x32 @ w32.T, 4 * (N * K + M * K + M * N)),
                FP16: (lambda: x @ w16.T, 2 * (N * K + M * K + M * N)),
                W4A16: (lambda: w4a16_linear(x, qweight, scales, zeros, None, None, GROUP_SIZE),
                        N * K // 2 + 5 * N * groups + 2 * (M * K + M * N)),
            }
            reference = providers[FP32][0]()
            stats = {name: summarize(name, M, gpu_times(fn, args.warmup, args.iterations, flush))
                     for name, (fn, _) in providers.items()}
            for name, (fn, nbytes) in providers.items():
                s = stats[name]
                seconds = s.p50_ms / 1e3
                gbs = nbytes / seconds / 1e9
                err = (fn().float() - reference).abs().max().item()
                rows.append(f"| {M} | {N} | {K} | {name} | {s.p50_ms:.4f} | {s.p90_ms:.4f} | {s.p99_ms:.4f} | "
                            f"{gbs:.0f} | {gbs / bandwidth:.0%} | {2 * M * N * K / seconds / 1e12:.2f} | "
                            f"{stats[FP16].p50_ms / s.p50_ms:.2f}x | {stats[FP32].p50_ms / s.p50_ms:.2f}x | "
                            f"{'reference' if name == FP32 else f'{err:.2e}'} |")
    notes.append(f"w4a16 weights: random codes, group size {GROUP_SIZE}, asymmetric zeros, no g_idx, no bias; "
                 "torch rows use the same weight dequantized (fp32, then rounded to fp16)")
    return ["| M | N | K | provider | p50 ms | p90 ms | p99 ms | GB/s | of copy BW | TFLOP/s | vs torch fp16 (p50) "
            "| vs fp32 (p50) | max abs err vs fp32 |", "| --- " * 13 + "|"] + rows


def norm_rows(args, flush, bandwidth: float) -> list[str]:
    from torch.nn import functional as F

    from infopt.kernels.norms import layer_norm, rms_norm

    gen = torch.Generator().manual_seed(1)
    rows = []
    for kind in ("rms_norm", "layer_norm"):
        for hidden in NORM_HIDDEN:
            weight = torch.randn(hidden, generator=gen).bfloat16().cuda()
            bias = torch.randn(hidden, generator=gen).bfloat16().cuda()
            w32, b32 = weight.float(), bias.float()
            for M in NORM_ROWS:
                x = torch.randn(M, hidden, generator=gen).bfloat16().cuda()
                x32 = x.float()
                if kind == "rms_norm":
                    providers = {FP32: lambda: F.rms_norm(x32, (hidden,), w32, 1e-6),
                                 "torch bf16": lambda: F.rms_norm(x, (hidden,), weight, 1e-6),
                                 "infopt triton": lambda: rms_norm(x, weight, 1e-6)}
                else:
                    providers = {FP32: lambda: F.layer_norm(x32, (hidden,), w32, b32, 1e-5),
                                 "torch bf16": lambda: F.layer_norm(x, (hidden,), weight, bias, 1e-5),
                                 "infopt triton": lambda: layer_norm(x, weight, bias, 1e-5)}
                reference = providers[FP32]()
                stats = {name: summarize(name, M, gpu_times(fn, args.warmup, args.iterations, flush))
                         for name, fn in providers.items()}
                for name, fn in providers.items():
                    s = stats[name]
                    width = 4 if name == FP32 else 2
                    gbs = (2 * M * hidden + 2 * hidden) * width / (s.p50_ms / 1e3) / 1e9
                    err = (fn().float() - reference).abs().max().item()
                    rows.append(f"| {kind} | {M} | {hidden} | {name} | {s.p50_ms:.4f} | {s.p90_ms:.4f} | "
                                f"{s.p99_ms:.4f} | {gbs:.0f} | {gbs / bandwidth:.0%} | "
                                f"{stats['torch bf16'].p50_ms / s.p50_ms:.2f}x | {stats[FP32].p50_ms / s.p50_ms:.2f}x | "
                                f"{'reference' if name == FP32 else f'{err:.2e}'} |")
    return ["| norm | rows | hidden | provider | p50 ms | p90 ms | p99 ms | GB/s | of copy BW | vs torch bf16 (p50) "
            "| vs fp32 (p50) | max abs err vs fp32 |", "| --- " * 12 + "|"] + rows


def main() -> None:
    args = arguments(__doc__, "w4a16.md", "w4a16,norms", "a fast check: 20 iterations; writes no results file")
    if not torch.cuda.is_available():
        print("bench_w4a16 needs a CUDA GPU and torch sees none (torch.cuda.is_available() is False)")
        sys.exit(4)
    try:
        import triton
    except ImportError:
        print("bench_w4a16 needs triton, which is not installed")
        sys.exit(4)
    started = time.perf_counter()
    flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    bandwidth = copy_bandwidth(flush)
    props = torch.cuda.get_device_properties(0)
    notes: list[str] = []
    sections = []
    chosen = [m.strip() for m in args.models.split(",")]
    if "w4a16" in chosen:
        sections.append("### W4A16 linear, fp16 activations\n\n" + "\n".join(gemm_rows(args, flush, bandwidth, notes)))
    if "norms" in chosen:
        sections.append("### RMSNorm and LayerNorm, bf16\n\n" + "\n".join(norm_rows(args, flush, bandwidth)))
    elapsed = time.perf_counter() - started
    lines = environment() + [
        f"GPU: {props.name}, sm_{props.major}{props.minor}, {props.multi_processor_count} SMs, "
        f"{props.total_memory / 2**30:.0f} GiB; CUDA {torch.version.cuda}, triton {triton.__version__}",
        f"measured copy bandwidth: {bandwidth:.0f} GB/s (1 GiB device-to-device copy, read + write bytes, p50 of 50)",
        f"{args.iterations} timed calls per row after {args.warmup} warm-up calls (autotuning happens in the warm-up), "
        f"each provider in its own block, L2 flushed before each call; whole run {elapsed:.0f} s",
        "vs columns: the other provider's p50 / this row's p50 (above 1: this row is faster)",
    ] + notes
    publish("\n\n".join(sections) + "\n\n" + "\n".join(f"- {line}" for line in lines), args.markdown)


if __name__ == "__main__":
    main()
