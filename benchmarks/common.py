"""What every benchmark script shares: its command line, the environment lines, timing with a
contention note, writing the result, and the MiniLM evaluation set."""

from __future__ import annotations

import argparse
import os
import platform
import time
from dataclasses import dataclass
from functools import cached_property
from importlib.metadata import version
from pathlib import Path
from typing import Callable

import numpy as np
import torch

import infopt
from infopt.validators.timing import measure

RESULTS = Path(__file__).resolve().parent / "results"


def arguments(doc: str, results_file: str, models: str, quick_help: str,
              extra: Callable[[argparse.ArgumentParser], None] | None = None) -> argparse.Namespace:
    """``--iterations/--warmup/--quick/--models/--workdir/--markdown``, and what ``extra`` adds;
    ``--markdown`` defaults to ``results/<results_file>`` except with ``--quick``, which writes nothing."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    if extra is not None:
        extra(parser)
    parser.add_argument("--iterations", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--quick", action="store_true", help=quick_help)
    parser.add_argument("--models", default=models, help=f"comma list of {models.replace(',', ', ')}")
    parser.add_argument("--workdir", type=Path, help="keep the builds here (default: a temporary folder)")
    parser.add_argument("--markdown", type=Path, help=f"where the tables go (default benchmarks/results/{results_file}; "
                        "with --quick, nowhere)")
    args = parser.parse_args()
    if args.quick:
        args.iterations, args.warmup = 20, 3
    elif args.markdown is None:
        args.markdown = RESULTS / results_file
    return args


def environment() -> list[str]:
    cpu = platform.processor() or "unknown cpu"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return [f"CPU: {cpu}, {os.cpu_count()} cores; torch threads {torch.get_num_threads()}",
            f"python {platform.python_version()}, torch {torch.__version__}, onnxruntime {version('onnxruntime')}, "
            f"infopt {infopt.__version__}"]


def publish(text: str, markdown: Path | None) -> None:
    """Print a result table and, when asked, write it to a markdown file. A file that exists keeps what it holds:
    the results files hold every dated run, newest first, after their title and summary, so the new text goes in
    before the first section after those (at the end where there is none)."""
    print(text)
    if markdown:
        markdown.parent.mkdir(parents=True, exist_ok=True)
        body = text.rstrip("\n") + "\n"
        if markdown.exists():
            lines = markdown.read_text().splitlines(keepends=True)
            at = next((i for i, line in enumerate(lines) if line.startswith("## ") and line.strip() != "## Summary"),
                      len(lines))
            body = "".join(lines[:at]).rstrip("\n") + "\n\n" + body + ("\n" + "".join(lines[at:]) if at < len(lines) else "")
        partial = markdown.with_name(markdown.name + ".partial")
        partial.write_text(body)
        partial.replace(markdown)


def cpu_seconds() -> tuple[float, float, float]:
    """(wall, CPU-s every process used, CPU-s this process used): other processes' share shows contention."""
    ticks = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    busy = (sum(ticks[:8]) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")
    own = os.times()
    return time.perf_counter(), busy, own.user + own.system


def timed(label: str, runners, feeds, warmup: int, iterations: int, threads: int):
    """``measure`` the runners side by side, and a note of how much CPU other processes took meanwhile."""
    before = cpu_seconds()
    stats = measure(runners, feeds, warmup=warmup, iterations=iterations).stats
    wall, busy, own = (a - b for a, b in zip(cpu_seconds(), before))
    other = max(busy - own, 0.0)
    return stats, (f"{label} timing: {wall:.1f} s; other processes used {other:.1f} CPU-s "
                   f"of the {threads * wall:.1f} the cores had ({other / (threads * wall):.0%})")


@dataclass
class MiniLMEval:
    """all-MiniLM-L6-v2 with its calibration and held-out evaluation sentences, tokenized at seq 64.

    Accuracy is judged on the evaluation sentences, which no build sees: each runner's embeddings,
    scaled to unit length, against eager FP32's (``reference``), so ``cosine`` is one cosine
    similarity per sentence."""

    model: torch.nn.Module
    calib_text: list[str]
    eval_text: list[str]
    calib: dict[str, np.ndarray]
    evaluation: dict[str, np.ndarray]
    names: tuple[str, ...] = ("input_ids", "attention_mask")

    def feed(self, batch: int) -> dict[str, np.ndarray]:
        """The first ``batch`` evaluation sentences, as a timing feed."""
        return {k: np.ascontiguousarray(v[:batch]) for k, v in self.evaluation.items()}

    def embed(self, run: Callable) -> np.ndarray:
        """Unit-length embeddings of every evaluation sentence, run 32 at a time."""
        out = np.concatenate([run({k: np.ascontiguousarray(v[i:i + 32]) for k, v in self.evaluation.items()})[0]
                              for i in range(0, len(self.eval_text), 32)])
        return out / np.linalg.norm(out, axis=1, keepdims=True)

    @cached_property
    def reference(self) -> np.ndarray:
        """Eager FP32's embeddings, computed at first use."""
        from infopt.runtime.runner import TorchRunner

        return self.embed(TorchRunner(self.model, self.names).run)

    def cosine(self, run: Callable) -> np.ndarray:
        """Per evaluation sentence, the cosine similarity of ``run``'s embedding to eager FP32's."""
        return (self.embed(run) * self.reference).sum(1)


def minilm_eval(quick: bool) -> MiniLMEval:
    """Load the encoder and tokenize its sentences; ``quick`` keeps 64 evaluation sentences."""
    from examples.minilm import load_encoder, sentences, tokenize

    model = load_encoder()
    calib_text, eval_text = sentences()
    if quick:
        eval_text = eval_text[:64]
    return MiniLMEval(model, calib_text, eval_text, tokenize(calib_text), tokenize(eval_text))
