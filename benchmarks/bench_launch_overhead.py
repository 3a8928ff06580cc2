"""Question: on a GPU machine, what does each piece of an eager kernel call cost on the host?

Host microseconds per call (a loop of N calls timed with ``perf_counter``, the GPU synchronized before
and after, warmed up first) for: torch's own ``F.rms_norm``, allocations (``torch.empty``,
``torch.zeros``), infopt's eager ``rms_norm`` and ``w4a16_linear`` (M = 1, 4096 x 4096), Triton's plain
``kernel[grid](...)`` launch of the RMSNorm kernel, a launch of the compiled kernel that
``gpu_kernels/launcher.py`` remembers, and the specialization key it computes per call. Bandwidth and
kernel times are in ``bench_w4a16.py``; this script times only the host side.

    python benchmarks/bench_launch_overhead.py [--calls 3000] [--markdown FILE]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import environment, publish  # noqa: E402


def per_call_us(fn, calls: int) -> float:
    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    began = time.perf_counter()
    for _ in range(calls):
        fn()
    spent = time.perf_counter() - began
    torch.cuda.synchronize()
    return spent / calls * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=3000)
    parser.add_argument("--markdown", type=Path)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("bench_launch_overhead needs a CUDA GPU and torch sees none (torch.cuda.is_available() is False)")
        sys.exit(4)
    from infopt.kernels import norms, w4a16
    from infopt.kernels.launcher import specialization

    x = torch.randn(16, 4096, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(4096, device="cuda", dtype=torch.bfloat16)
    y = torch.empty_like(x)
    config = norms.norm_config(4096, False)
    launch_args = [x, w, y, 4096, 4096, 4096, 1e-6]
    xq = torch.randn(1, 4096, device="cuda", dtype=torch.float16)
    q = torch.randint(0, 255, (4096, 2048), device="cuda", dtype=torch.uint8)
    s = torch.rand(4096, 32, device="cuda")
    z = torch.randint(0, 15, (4096, 32), device="cuda", dtype=torch.uint8)
    w16 = torch.randn(4096, 4096, device="cuda", dtype=torch.float16)
    rows = {
        "torch F.rms_norm (16 x 4096, bf16)": lambda: torch.nn.functional.rms_norm(x, (4096,), w, 1e-6),
        "torch F.linear (1 x 4096 @ 4096 x 4096, fp16)": lambda: torch.nn.functional.linear(xq, w16),
        "torch.empty (16 x 4096)": lambda: torch.empty((16, 4096), dtype=x.dtype, device=x.device),
        "torch.zeros (16 x 4096)": lambda: torch.zeros((16, 4096), dtype=x.dtype, device=x.device),
        "infopt rms_norm, eager": lambda: norms.rms_norm(x, w, 1e-6),
        "infopt w4a16_linear, eager (M = 1)": lambda: w4a16.w4a16_linear(xq, q, s, z, None, None, 128),
        "Triton kernel[grid](...) (the RMSNorm kernel)":
            lambda: norms._rms_norm_kernel[(16,)](*launch_args, HAS_WEIGHT=True, **config),
        "specialization key (7 arguments)": lambda: specialization(launch_args),
    }
    measured = {name: per_call_us(fn, args.calls) for name, fn in rows.items()}
    relaunch = norms._RELAUNCH["_rms_norm_kernel"]
    if relaunch.cache:
        compiled, _, tail = next(iter(relaunch.cache.values()))
        values = launch_args + tail
        measured["the remembered compiled kernel, compiled[grid](...)"] = per_call_us(
            lambda: compiled[(16, 1, 1)](*values), args.calls)
    else:
        measured["the remembered compiled kernel"] = float("nan")
    props = torch.cuda.get_device_properties(0)
    table = ["| host work per call | us per call |", "| --- | --- |"] + [f"| {k} | {v:.1f} |" for k, v in measured.items()]
    lines = environment() + [f"GPU: {props.name}; CUDA {torch.version.cuda}; run on {time.strftime('%Y-%m-%d')}",
                             f"{args.calls} calls per row after 50 warm-up calls; relauncher on: {relaunch.enabled}"]
    publish("\n".join(table) + "\n\n" + "\n".join(f"- {line}" for line in lines), args.markdown)


if __name__ == "__main__":
    main()
