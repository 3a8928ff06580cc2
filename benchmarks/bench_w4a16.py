"""Question: how close to the GPU's memory bandwidth does infopt's W4A16 kernel run, how much faster
than torch's fp16 matmul and torch's own INT4 kernel is it, and what does a call cost on top?

For ``y = x @ W.T`` with ``x`` ``[M, K]``, M in 1, 4, 16, 64, 256 and (N, K) in (4096, 4096),
(4096, 11008), (11008, 4096) (Llama-7B's attention and MLP projections), in one run:

- torch fp16 and bf16: ``F.linear`` (cuBLAS) on the dequantized weight;
- torch int4 (tinygemm): ``torch._weight_int4pack_mm`` after ``torch._convert_weight_to_int4pack``,
  what torchao's int4 weight-only calls (bf16 activations);
- infopt w4a16 fp16 and bf16: ``infopt.kernels.w4a16.w4a16_linear`` on the same INT4 weight (group
  size 128, asymmetric zeros) in the kernel layout.

Per row:

- **kernel**: the call alone, replayed in a CUDA graph (no host work), p50/p99 per call. The graph
  calls the provider on R copies of the weight in turn, R large enough that they overflow L2 three
  times, so weights come from HBM as in decoding, where each layer's weights are read once per token;
- **call**: the same R calls made eagerly, as a model calls them (dispatch, allocation, launch),
  CUDA events around each round, p50 per call; **host us** is the host time per eager call;
- **GB/s** is bytes moved (weights with their scales and zeros, x, y) / kernel p50, against the
  copy bandwidth measured in the same run (a 1 GiB device-to-device copy, read + write bytes);
- ratios are the other provider's kernel p50 / this row's (above 1: this row is faster), and this
  row's call p50 / its kernel p50; accuracy is the max abs difference to the fp32 result.

``--models norms`` adds RMSNorm and LayerNorm (bf16, hidden 4096 and 8192, rows 1 to 4096): torch
bf16 eager against infopt's op path, each as kernel (graph) and call. ``--models mlp`` times an
8-layer INT4 MLP (4096 x 4096, M = 1) per forward: fp16 ``nn.Linear`` against infopt's
``W4A16Linear``, eager, in infopt's CUDA-graph runner, and under ``torch.compile``.

    python benchmarks/bench_w4a16.py [--iterations 100] [--markdown benchmarks/results/w4a16.md]
    python benchmarks/bench_w4a16.py --quick [--models w4a16]     # a fast check; writes no results file
"""

from __future__ import annotations

import math
import sys
import time
import traceback
from pathlib import Path

import torch
from torch.nn import functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import arguments, environment, publish  # noqa: E402
from infopt.validators.timing import summarize  # noqa: E402

MS = (1, 4, 16, 64, 256)
SHAPES = ((4096, 4096), (4096, 11008), (11008, 4096))
GROUP_SIZE = 128
NORM_ROWS = (1, 16, 256, 4096)
NORM_HIDDEN = (4096, 8192)
FP16, BF16, TINYGEMM, INFOPT16, INFOPT_BF16 = "torch fp16", "torch bf16", "torch int4 (tinygemm, bf16)", \
    "infopt w4a16 fp16", "infopt w4a16 bf16"


def per_call_stats(rounds: list[float], calls: int):
    """p50/p90/p99 in microseconds per call from seconds per round of ``calls`` calls."""
    return summarize("", 1, [r / calls for r in rounds])


def graph_rounds(calls: list, replays: int) -> list[float]:
    """Seconds per replay of one CUDA graph holding every call in ``calls`` (warmed up first)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            for call in calls:
                call()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for call in calls:
            call()
    for _ in range(3):
        graph.replay()
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(replays)]
    torch.cuda.synchronize()
    for start, end in events:
        start.record()
        graph.replay()
        end.record()
    torch.cuda.synchronize()
    return [start.elapsed_time(end) / 1e3 for start, end in events]


def eager_rounds(calls: list, rounds: int) -> tuple[list[float], float]:
    """Seconds per eager round of ``calls`` (CUDA events), and host seconds per call (launch side)."""
    for call in calls:
        call()
    torch.cuda.synchronize()
    events, host = [], 0.0
    for _ in range(rounds):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        began = time.perf_counter()
        for call in calls:
            call()
        host += time.perf_counter() - began
        end.record()
        events.append((start, end))
        end.synchronize()
    return [start.elapsed_time(end) / 1e3 for start, end in events], host / (rounds * len(calls))


def copy_bandwidth() -> float:
    """GB/s of a 1 GiB device-to-device copy, counting the bytes read and the bytes written."""
    src = torch.ones(1 << 30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    rounds = graph_rounds([lambda: dst.copy_(src)], 20)
    return 2 * src.numel() / per_call_stats(rounds, 1).p50_ms * 1e3 / 1e9


def copies_for(nbytes: int) -> int:
    """Weight copies whose total overflows L2 three times (at least 2, at most 64)."""
    l2 = getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 50 << 20)
    return max(2, min(64, math.ceil(3 * l2 / max(nbytes, 1))))


def int4_weights(N: int, K: int, gen: torch.Generator) -> dict:
    """One random INT4 weight: infopt's packed form and kernel layout, tinygemm's, and the float forms."""
    from infopt.kernels.w4a16_layout import to_kernel_layout
    from infopt.quantize.int4_format import dequantize_int4, pack_int4

    groups = K // GROUP_SIZE
    codes = torch.randint(0, 16, (N, K), generator=gen)
    scales = (torch.rand(N, groups, generator=gen) + 0.5) / (5 * K ** 0.5)
    zeros = torch.randint(0, 16, (N, groups), generator=gen).to(torch.uint8)
    qweight = pack_int4(codes)
    w32 = dequantize_int4(qweight, scales, zeros, None, GROUP_SIZE)
    kernel_q, _ = to_kernel_layout(qweight, None, GROUP_SIZE)
    return {"codes": codes, "scales": scales, "zeros": zeros, "kernel_q": kernel_q, "w32": w32}


def tinygemm_weight(weight: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """torch's tinygemm layout: codes packed high nibble first, then ``[K/g, N, 2]`` bf16 scale and
    float zero with ``w = (q - 8) * scale + zero``, i.e. zero = ``(8 - z) * scale``."""
    codes = weight["codes"].to(torch.uint8)
    packed = (codes[:, ::2] << 4 | codes[:, 1::2]).cuda()
    packed = torch._convert_weight_to_int4pack(packed, 8)
    scales = weight["scales"]
    zero = (8 - weight["zeros"].float()) * scales
    return packed, torch.stack([scales.T, zero.T], dim=-1).to(torch.bfloat16).cuda().contiguous()


def providers(weight: dict, M: int, N: int, K: int, gen: torch.Generator) -> dict:
    """name -> (make one call on weight copy ``i``, bytes per call, copies, reference-comparable call)."""
    from infopt.kernels.w4a16 import w4a16_linear

    x32 = torch.randn(M, K, generator=gen).cuda()
    x16, xbf = x32.half(), x32.bfloat16()
    groups = K // GROUP_SIZE
    act_out = 2 * (M * K + M * N)
    int4_bytes = N * K // 2 + 4 * N * groups + N * groups + act_out
    found = {}
    dense = {FP16: (x16, torch.float16), BF16: (xbf, torch.bfloat16)}
    for name, (x, dtype) in dense.items():
        w = weight["w32"].to(dtype).cuda()
        copies = [w] + [w.clone() for _ in range(copies_for(w.numel() * 2) - 1)]
        found[name] = ([lambda i, x=x, c=copies: F.linear(x, c[i])], 2 * N * K + act_out, len(copies))
    q, s, z = (weight[k].cuda() for k in ("kernel_q", "scales", "zeros"))
    copies = [(q, s, z)] + [(q.clone(), s.clone(), z.clone()) for _ in range(copies_for(int4_bytes) - 1)]
    for name, x in ((INFOPT16, x16), (INFOPT_BF16, xbf)):
        found[name] = ([lambda i, x=x, c=copies: w4a16_linear(x, c[i][0], c[i][1], c[i][2], None, None, GROUP_SIZE)],
                       int4_bytes, len(copies))
    try:
        packed, sz = tinygemm_weight(weight)
        tiny = [(packed, sz)] + [(packed.clone(), sz.clone()) for _ in range(copies_for(int4_bytes) - 1)]
        found[TINYGEMM] = ([lambda i, c=tiny: torch._weight_int4pack_mm(xbf, c[i][0], GROUP_SIZE, c[i][1])],
                           N * K // 2 + 4 * N * groups + act_out, len(tiny))
    except Exception as exc:  # noqa: BLE001 - torch's private INT4 API changes between releases
        found[TINYGEMM] = f"not run: {type(exc).__name__}: {str(exc).splitlines()[0][:120]}"
    return {"x32": x32, "providers": found}


def gemm_rows(args, bandwidth: float, notes: list[str]) -> list[str]:
    gen = torch.Generator().manual_seed(0)
    rows = []
    for N, K in SHAPES:
        weight = int4_weights(N, K, gen)
        for M in MS:
            made = providers(weight, M, N, K, gen)
            reference = made["x32"] @ weight["w32"].cuda().T
            measured = {}
            for name, entry in made["providers"].items():
                if isinstance(entry, str):
                    rows.append(f"| {M} | {N} | {K} | {name} | {entry} |" + " |" * 11)
                    continue
                (make,), nbytes, copies = entry
                calls = [lambda i=i: make(i) for i in range(copies)]
                try:
                    kernel = per_call_stats(graph_rounds(calls, args.iterations), copies)
                    rounds, host = eager_rounds(calls, max(args.iterations // 4, 5))
                    call = per_call_stats(rounds, copies)
                    err = (make(0).float() - reference).abs().max().item()
                except Exception as exc:  # noqa: BLE001 - one provider failing must not lose the run
                    rows.append(f"| {M} | {N} | {K} | {name} | failed: {type(exc).__name__}: "
                                f"{str(exc).splitlines()[0][:160]} |" + " |" * 11)
                    continue
                measured[name] = (kernel, call, host, nbytes, err)
            rows += [_gemm_row(M, N, K, name, measured, bandwidth) for name in measured]
    notes.append(f"weights: random codes, group size {GROUP_SIZE}, asymmetric zeros, no act-order, no bias; the "
                 "torch rows use the same weight dequantized (fp32, then rounded to fp16/bf16)")
    return ["| M | N | K | provider | kernel p50 us | kernel p99 us | call p50 us | host us/call | call / kernel "
            "| GB/s | of copy BW | vs torch fp16 | vs tinygemm | max abs err vs fp32 |", "| --- " * 14 + "|"] + rows


def _gemm_row(M, N, K, name, measured, bandwidth) -> str:
    kernel, call, host, nbytes, err = measured[name]
    us = kernel.p50_ms * 1e3
    gbs = nbytes / (kernel.p50_ms / 1e3) / 1e9

    def ratio(other):
        return f"{measured[other][0].p50_ms / kernel.p50_ms:.2f}x" if other in measured else "-"

    return (f"| {M} | {N} | {K} | {name} | {us:.1f} | {kernel.p99_ms * 1e3:.1f} | {call.p50_ms * 1e3:.1f} | "
            f"{host * 1e6:.1f} | {call.p50_ms / kernel.p50_ms:.2f} | {gbs:.0f} | {gbs / bandwidth:.0%} | "
            f"{ratio(FP16)} | {ratio(TINYGEMM)} | {err:.2e} |")


def norm_rows(args, bandwidth: float) -> list[str]:
    from infopt.kernels.norms import layer_norm, rms_norm

    gen = torch.Generator().manual_seed(1)
    rows = []
    for kind in ("rms_norm", "layer_norm"):
        for hidden in NORM_HIDDEN:
            weight = torch.randn(hidden, generator=gen).bfloat16().cuda()
            bias = torch.randn(hidden, generator=gen).bfloat16().cuda()
            for M in NORM_ROWS:
                x = torch.randn(M, hidden, generator=gen).bfloat16().cuda()
                if kind == "rms_norm":
                    made = {"torch bf16": lambda: F.rms_norm(x, (hidden,), weight, 1e-6),
                            "infopt": lambda: rms_norm(x, weight, 1e-6)}
                    reference = F.rms_norm(x.float(), (hidden,), weight.float(), 1e-6)
                else:
                    made = {"torch bf16": lambda: F.layer_norm(x, (hidden,), weight, bias, 1e-5),
                            "infopt": lambda: layer_norm(x, weight, bias, 1e-5)}
                    reference = F.layer_norm(x.float(), (hidden,), weight.float(), bias.float(), 1e-5)
                measured = {}
                for name, fn in made.items():
                    kernel = per_call_stats(graph_rounds([fn] * 8, args.iterations), 8)
                    rounds, host = eager_rounds([fn] * 8, max(args.iterations // 4, 5))
                    measured[name] = (kernel, per_call_stats(rounds, 8), host, (fn().float() - reference).abs().max().item())
                for name, (kernel, call, host, err) in measured.items():
                    torch_kernel, torch_call = measured["torch bf16"][:2]
                    gbs = (2 * M * hidden + 2 * hidden) * 2 / (kernel.p50_ms / 1e3) / 1e9
                    rows.append(f"| {kind} | {M} | {hidden} | {name} | {kernel.p50_ms * 1e3:.1f} | {call.p50_ms * 1e3:.1f} | "
                                f"{host * 1e6:.1f} | {gbs:.0f} | {gbs / bandwidth:.0%} | "
                                f"{torch_kernel.p50_ms / kernel.p50_ms:.2f}x | {torch_call.p50_ms / call.p50_ms:.2f}x | "
                                f"{err:.2e} |")
    return ["| norm | rows | hidden | provider | kernel p50 us | call p50 us | host us/call | GB/s | of copy BW "
            "| kernel vs torch bf16 | call vs torch bf16 | max abs err vs fp32 |", "| --- " * 12 + "|"] + rows


def mlp_rows(args) -> list[str]:
    """An 8-layer INT4 MLP, 4096 x 4096, M = 1: time per forward, fp16 against infopt's kernels."""
    from torch import nn

    from infopt.kernels.w4a16 import use_w4a16_kernels
    from infopt.quantize.int4_config import RTNConfig
    from infopt.quantize.weight_only import quantize_int4
    from infopt.runtime.cuda_graphs import GraphedCallable

    torch.manual_seed(2)
    layers = [nn.Linear(4096, 4096, bias=False) for _ in range(8)]
    dense = nn.Sequential(*[m for layer in layers for m in (layer, nn.ReLU())]).eval()
    quantized = nn.Sequential(*[m for layer in layers for m in (layer, nn.ReLU())]).eval()
    quantize_int4(quantized, RTNConfig(group_size=GROUP_SIZE))  # replaces the Linears of this Sequential only
    kept = use_w4a16_kernels(quantized)
    dense, quantized = dense.half().cuda(), quantized.half().cuda()
    x = torch.randn(1, 4096).half().cuda()
    reference = dense.float()(x.float())
    dense.half()
    variants = {"fp16 nn.Linear, eager": dense, "infopt W4A16Linear, eager": quantized}
    rows = []
    with torch.inference_mode():
        variants["fp16 nn.Linear, CUDA graph"] = GraphedCallable(dense)
        variants["infopt W4A16Linear, CUDA graph"] = GraphedCallable(quantized)
        for label, model in (("fp16", dense), ("infopt", quantized)):
            try:
                variants[f"{label}, torch.compile(mode='reduce-overhead')"] = torch.compile(model, mode="reduce-overhead")
            except Exception as exc:  # noqa: BLE001
                rows.append(f"| {label} torch.compile | failed: {type(exc).__name__}: {str(exc)[:160]} | | | |")
        base = None
        for name, model in variants.items():
            try:
                rounds, host = eager_rounds([lambda m=model: m(x)] * 4, max(args.iterations // 2, 10))
                stats = per_call_stats(rounds, 4)
                err = (model(x).float() - reference).abs().max().item()
            except Exception as exc:  # noqa: BLE001 - one variant failing must not lose the run
                rows.append(f"| {name} | failed: {type(exc).__name__}: {str(exc).splitlines()[0][:160]} | | | |")
                continue
            base = base or stats.p50_ms
            rows.append(f"| {name} | {stats.p50_ms * 1e3:.1f} | {stats.p99_ms * 1e3:.1f} | {base / stats.p50_ms:.2f}x | "
                        f"{err:.2e} |")
    note = f"; layers kept in float: {kept}" if kept else ""
    return ["| model, M = 1 | p50 us per forward | p99 us | vs fp16 eager | max abs err vs fp32 |",
            "| --- " * 5 + "|"] + rows + ([f"\n{note}"] if note else [])


def section(title: str, make) -> str:
    """A table, or the error that stopped it (the other sections still run)."""
    try:
        return f"### {title}\n\n" + "\n".join(make())
    except Exception:  # noqa: BLE001
        return f"### {title}\n\nfailed:\n\n```\n{traceback.format_exc()[-3000:]}```"


def main() -> None:
    args = arguments(__doc__, "w4a16.md", "w4a16,norms,mlp", "a fast check: 20 iterations; writes no results file")
    if not torch.cuda.is_available():
        print("bench_w4a16 needs a CUDA GPU and torch sees none (torch.cuda.is_available() is False)")
        sys.exit(4)
    try:
        import triton
    except ImportError:
        print("bench_w4a16 needs triton, which is not installed")
        sys.exit(4)
    started = time.perf_counter()
    bandwidth = copy_bandwidth()
    props = torch.cuda.get_device_properties(0)
    notes: list[str] = []
    chosen = [m.strip() for m in args.models.split(",")]
    sections = []
    if "w4a16" in chosen:
        sections.append(section("W4A16 linear", lambda: gemm_rows(args, bandwidth, notes)))
    if "norms" in chosen:
        sections.append(section("RMSNorm and LayerNorm, bf16", lambda: norm_rows(args, bandwidth)))
    if "mlp" in chosen:
        sections.append(section("8-layer INT4 MLP (4096 x 4096), M = 1", lambda: mlp_rows(args)))
    elapsed = time.perf_counter() - started
    lines = environment() + [
        f"GPU: {props.name}, sm_{props.major}{props.minor}, {props.multi_processor_count} SMs, "
        f"{props.total_memory / 2**30:.0f} GiB; CUDA {torch.version.cuda}, triton {triton.__version__}; "
        f"run on {time.strftime('%Y-%m-%d')}",
        f"measured copy bandwidth: {bandwidth:.0f} GB/s (1 GiB device-to-device copy in a CUDA graph, read + write "
        "bytes, p50 of 20)",
        f"kernel: {args.iterations} graph replays per row; call: {max(args.iterations // 4, 5)} eager rounds; "
        f"autotuning happens in the warm-up; whole run {elapsed:.0f} s",
    ] + notes
    publish("\n\n".join(sections) + "\n\n" + "\n".join(f"- {line}" for line in lines), args.markdown)


if __name__ == "__main__":
    main()
