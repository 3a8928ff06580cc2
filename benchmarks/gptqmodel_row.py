"""gptqmodel's GPTQ on a Hugging Face folder, for ``bench_real_llm.py``'s ``gptqmodel`` rows, in its own process.

    python benchmarks/gptqmodel_row.py quantize SOURCE OUT --calib calib.txt --group-size 128
    python benchmarks/gptqmodel_row.py judge OUT --windows windows.json --figures figures.npz

``quantize`` is what a gptqmodel user runs on CPU: ``GPTQModel.load`` with a 4-bit ``QuantizeConfig`` (asymmetric,
no act-order, gptqmodel's other defaults), ``quantize`` on the calibration lines, ``save``. ``judge`` loads the
checkpoint with gptqmodel's pure-torch kernel (its CPU int4 kernel refuses a 576-wide layer at group size 128)
and writes each window's top-1 tokens and next-token NLLs, and the greedy tokens, as ``reference_figures`` does.
Each mode is a process of its own: gptqmodel patches torch and prints banners on import.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# gptqmodel sizes its CPU pool from half the cores and refuses a pool of one on a 2-core machine
os.environ.setdefault("GPTQMODEL_CPU_WORKERS", str(max(2, os.cpu_count() or 2)))


def quantize(source: Path, out: Path, calib: Path, group_size: int) -> None:
    from gptqmodel import GPTQModel, QuantizeConfig

    lines = [line for line in calib.read_text().splitlines() if line.strip()]
    config = QuantizeConfig(bits=4, group_size=group_size, desc_act=False, sym=False)
    model = GPTQModel.load(str(source), config, device="cpu")
    model.quantize(lines, batch_size=16)
    model.save(str(out))


def judge(out: Path, windows: Path, figures: Path) -> None:
    from gptqmodel import GPTQModel

    from infopt.validators.generation import eager_figures, generate_eager
    from tests.support.real_llm import GREEDY, GREEDY_PROMPTS, PROMPT

    sequences = json.loads(windows.read_text())
    model = GPTQModel.load(str(out), device="cpu", backend="torch").model.eval()
    top1, nll = eager_figures(model, sequences)
    greedy = generate_eager(model, [w[:PROMPT] for w in sequences[:GREEDY_PROMPTS]], GREEDY)
    np.savez(figures, **{f"top1_{i}": t for i, t in enumerate(top1)}, **{f"nll_{i}": n for i, n in enumerate(nll)},
             greedy=np.array(greedy))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="mode", required=True)
    q = sub.add_parser("quantize")
    q.add_argument("source", type=Path)
    q.add_argument("out", type=Path)
    q.add_argument("--calib", type=Path, required=True)
    q.add_argument("--group-size", type=int, default=128)
    j = sub.add_parser("judge")
    j.add_argument("out", type=Path)
    j.add_argument("--windows", type=Path, required=True)
    j.add_argument("--figures", type=Path, required=True)
    options = parser.parse_args()
    if options.mode == "quantize":
        quantize(options.source, options.out, options.calib, options.group_size)
    else:
        judge(options.out, options.windows, options.figures)


if __name__ == "__main__":
    main()
