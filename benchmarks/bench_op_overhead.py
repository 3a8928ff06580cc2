"""Question: how much host time does a call to infopt's W4A16 op cost before the kernel launches,
and how much of it does the direct path save? Measured on the CPU, where the dispatcher and the
Python around a launch run exactly as they do beside a GPU; the Triton launch itself needs a GPU
and is left out (``bench_w4a16.py`` measures whole calls on one).

Rows, each the p50 of 20 blocks of 2000 calls on CPU tensors, M = 1, N = K = 4096, group size 128:

- a Python function that allocates its output, then the same function as a Python
  ``torch.library.custom_op``: the difference is what the dispatcher adds to every call through
  ``torch.ops`` (every eager call took that path before; the direct path skips it);
- ``check_inputs`` (on ``meta`` copies, which it accepts as it does CUDA tensors): the argument
  checks every call ran before, now run once where the weight is put
  into the kernel layout (and by the op's fake implementation when a compiler traces it);
- the direct path's prologue (``kernels.w4a16._launch`` up to the launch): reshape, allocation,
  tile choice. Before, a decoding call also paid three more ops after the kernel (the split-K sum,
  the bias, the copy out), each with its own dispatch and launch.

    python benchmarks/bench_op_overhead.py [--markdown benchmarks/results/op_overhead.md]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import environment, publish  # noqa: E402
from infopt.kernels import w4a16  # noqa: E402


class _NoLaunch:
    """Stands where ``kernel[grid](...)`` launches: the launch needs a GPU and is not what is timed."""

    def __getitem__(self, grid):
        return lambda *args, **kwargs: None


def per_call_us(fn, calls: int = 2000, blocks: int = 20) -> float:
    for _ in range(200):
        fn()
    times = []
    for _ in range(blocks):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        times.append((time.perf_counter() - start) / calls * 1e6)
    return statistics.median(times)


@torch.library.custom_op("infopt_bench::empty", mutates_args=())
def _empty_op(x: torch.Tensor) -> torch.Tensor:
    return x.new_empty(x.shape)


_empty_op.register_fake(lambda x: x.new_empty(x.shape))


def _empty(x: torch.Tensor) -> torch.Tensor:
    return x.new_empty(x.shape)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--markdown", type=Path)
    args = parser.parse_args()
    N = K = 4096
    g = 128
    x = torch.zeros(1, K, dtype=torch.float16)
    qweight = torch.zeros(N, K // 2, dtype=torch.uint8)
    scales = torch.zeros(N, K // g, dtype=torch.float32)
    zeros = torch.zeros(N, K // g, dtype=torch.uint8)
    small = torch.zeros(1, N, dtype=torch.float16)
    meta = [t.to("meta") for t in (x, qweight, scales, zeros)]  # the checks read shapes only; on CPU the last one refuses
    rows = [
        ("plain Python function allocating its output", per_call_us(lambda: _empty(small))),
        ("the same as a Python custom_op (the difference is the dispatcher's share)",
         per_call_us(lambda: torch.ops.infopt_bench.empty(small))),
        ("check_inputs (before: every call; now once per layer)",
          per_call_us(lambda: w4a16.check_inputs(*meta, None, None, g))),
        ("the direct path before its launch (w4a16._launch)",
         per_call_us(lambda: w4a16._launch(x, qweight, scales, zeros, None, None, g, lambda kernel: _NoLaunch()))),
    ]
    table = ["| host work per call (CPU, launch excluded) | us per call (p50 of 20 blocks) |", "| --- | --- |"]
    table += [f"| {name} | {us:.2f} |" for name, us in rows]
    lines = environment() + [f"triton {'not installed' if w4a16.triton is None else w4a16.triton.__version__}; "
                             f"run on {time.strftime('%Y-%m-%d')}"]
    publish("\n".join(table) + "\n\n" + "\n".join(f"- {line}" for line in lines), args.markdown)


if __name__ == "__main__":
    main()
