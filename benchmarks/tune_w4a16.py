"""Question: which tiles, pipeline depths and K splits make the W4A16 kernel fastest on this GPU?

Each candidate config is launched directly (no autotuner) on Llama-7B's three layer shapes at
M = 1, 16, 64 and 256 (fp16), timed alone by CUDA-graph replay over weight copies that overflow L2
(as ``bench_w4a16.py`` does; a split-K config's call includes zeroing its output) and checked against
the fp32 reference. It prints the fastest configs per shape and M beside torch fp16, and the time of
the configs the kernel autotunes over today. Compilation runs first in parallel worker processes that
fill Triton's cache.

    python benchmarks/tune_w4a16.py [--workers 12] [--markdown benchmarks/results/tune_w4a16.md]
"""

from __future__ import annotations

import argparse
import itertools
import os
import subprocess
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.bench_w4a16 import GROUP_SIZE, SHAPES, copies_for, graph_rounds, int4_weights, per_call_stats  # noqa: E402

MS = (1, 16, 64, 256)


def candidates(M: int) -> list[dict]:
    """The configs tried at ``M``: BLOCK_N, BLOCK_M, GROUPS_PER_STEP, SPLIT_K, warps, stages."""
    found = []
    if M <= 16:
        for n, (s, st), split in itertools.product((32, 64, 128), ((1, 4), (2, 3), (2, 4), (4, 3)), (2, 4, 8, 16)):
            found.append(dict(BLOCK_N=n, BLOCK_M=16, GROUPS_PER_STEP=s, SPLIT_K=split,
                              num_warps=4 if n < 128 else 8, num_stages=st))
    else:
        tiles = ((64, 32), (64, 64), (128, 64)) if M <= 64 else ((64, 128), (128, 128), (64, 256))
        for (n, m), split, (w, st) in itertools.product(tiles, (1, 2, 4), ((4, 3), (8, 3))):
            found.append(dict(BLOCK_N=n, BLOCK_M=m, GROUPS_PER_STEP=1, SPLIT_K=split, num_warps=w, num_stages=st))
    return found


def jobs() -> list[tuple[int, int, int, dict]]:
    return [(M, N, K, c) for N, K in SHAPES for M in MS for c in candidates(M)]


def launch(config: dict, x, q, s, z, M: int, N: int, K: int):
    """One call of ``config``; a split-K config's output is zeroed first (part of the call)."""
    from infopt.kernels import w4a16

    meta = dict(config)
    warps, stages = meta.pop("num_warps"), meta.pop("num_stages")
    out = (torch.zeros if meta["SPLIT_K"] > 1 else torch.empty)((M, N), dtype=x.dtype, device=x.device)
    grid = (-(-N // meta["BLOCK_N"]), -(-M // meta["BLOCK_M"]), meta["SPLIT_K"])
    w4a16._w4a16_kernel[grid](x, q, s, z, z, s, out, M, N, K, K // 2, x.stride(0), w4a16._bucket(M), GROUP=GROUP_SIZE,
                              HALF=GROUP_SIZE // 2, HAS_PERM=False, HAS_BIAS=False, DOT_FP32=False, **meta,
                              num_warps=warps, num_stages=stages)
    return out


def compile_shard(shard: int, shards: int) -> None:
    """Launch this shard's configs once each (fills Triton's on-disk cache)."""
    for i, (M, N, K, config) in enumerate(jobs()):
        if i % shards != shard:
            continue
        x = torch.randn(M, K, device="cuda", dtype=torch.float16)
        q = torch.randint(0, 255, (N, K // 2), device="cuda", dtype=torch.uint8)
        s = torch.rand(N, K // GROUP_SIZE, device="cuda")
        z = torch.randint(0, 15, (N, K // GROUP_SIZE), device="cuda", dtype=torch.uint8)
        try:
            launch(config, x, q, s, z, M, N, K)
        except Exception as exc:  # noqa: BLE001 - a config that does not compile is reported by the timing pass
            print(f"compile failed {config}: {type(exc).__name__}: {str(exc)[:200]}", file=sys.stderr)
    torch.cuda.synchronize()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", type=int, default=min(12, os.cpu_count() or 1))
    parser.add_argument("--shard", type=int)
    parser.add_argument("--iterations", type=int, default=50)
    parser.add_argument("--markdown", type=Path)
    args = parser.parse_args()
    if args.shard is not None:
        compile_shard(args.shard, args.workers)
        return
    started = time.perf_counter()
    workers = [subprocess.Popen([sys.executable, __file__, "--shard", str(i), "--workers", str(args.workers)])
               for i in range(args.workers)]
    for worker in workers:
        worker.wait()
    compiled = time.perf_counter() - started
    from torch.nn import functional as F

    from infopt.kernels import w4a16

    gen = torch.Generator().manual_seed(0)
    lines = ["| M | N | K | torch fp16 us | today's configs, best us | best us | vs fp16 | best config | 2nd | 3rd |",
             "| --- " * 10 + "|"]
    today = {True: w4a16.kernel_configs(True), False: w4a16.kernel_configs(False)}
    for N, K in SHAPES:
        weight = int4_weights(N, K, gen)
        q, s, z = (weight[k].cuda() for k in ("kernel_q", "scales", "zeros"))
        nbytes = N * K // 2 + 5 * N * (K // GROUP_SIZE)
        copies = [(q, s, z)] + [(q.clone(), s.clone(), z.clone()) for _ in range(copies_for(nbytes) - 1)]
        w16 = weight["w32"].half().cuda()
        dense = [w16] + [w16.clone() for _ in range(copies_for(2 * N * K) - 1)]
        for M in MS:
            x = torch.randn(M, K, generator=gen).half().cuda()
            reference = x.float() @ weight["w32"].cuda().T
            fp16 = per_call_stats(graph_rounds([lambda w=w: F.linear(x, w) for w in dense], args.iterations),
                                  len(dense)).p50_ms * 1e3
            timed = []
            for config in candidates(M) + [c for c in today[M <= 16] if c not in candidates(M)]:
                try:
                    calls = [lambda c=c: launch(config, x, *c, M, N, K) for c in copies]
                    us = per_call_stats(graph_rounds(calls, args.iterations), len(calls)).p50_ms * 1e3
                    err = (launch(config, x, q, s, z, M, N, K).float() - reference).abs().max().item()
                except Exception as exc:  # noqa: BLE001
                    print(f"M={M} N={N} K={K} {config}: {type(exc).__name__}: {str(exc)[:200]}", file=sys.stderr)
                    continue
                if err > 0.05:
                    print(f"M={M} N={N} K={K} {config}: wrong, max abs err {err:.3g}", file=sys.stderr)
                    continue
                timed.append((us, config))
            timed.sort(key=lambda t: t[0])
            best_today = min((us for us, c in timed if c in today[M <= 16]), default=float("nan"))

            def short(c):
                return (f"{c['BLOCK_N']}x{c['BLOCK_M']} g{c['GROUPS_PER_STEP']} k{c['SPLIT_K']} "
                        f"w{c['num_warps']} s{c['num_stages']}")

            top = [f"{short(c)} ({us:.1f})" for us, c in timed[:3]] + ["-"] * 3
            lines.append(f"| {M} | {N} | {K} | {fp16:.1f} | {best_today:.1f} | {timed[0][0]:.1f} | "
                         f"{fp16 / timed[0][0]:.2f}x | {top[0]} | {top[1]} | {top[2]} |")
            print(lines[-1], flush=True)
    props = torch.cuda.get_device_properties(0)
    text = "\n".join(lines) + (f"\n\n- GPU: {props.name}; torch {torch.__version__}; run on {time.strftime('%Y-%m-%d')}; "
                               f"compile {compiled:.0f} s with {args.workers} workers, whole run "
                               f"{time.perf_counter() - started:.0f} s")
    print(text)
    if args.markdown:
        args.markdown.write_text(text + "\n")


if __name__ == "__main__":
    main()
