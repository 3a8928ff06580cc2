"""The text-generation task's evaluator: what judges a generator folder, at build time and again later.

At build time :meth:`GenerationSamples.from_model` runs the source model (transformers; in FP32, or in BF16 for
an INT4 build of a BF16 checkpoint) once: its greedy tokens on the prompts, and its logits on the held-out
sequences, reduced to what the figures are computed from (each position's top-1 token and each next token's
negative log-likelihood; whole logits would be tokens x vocabulary floats, gigabytes at a real vocabulary).
They are stored in ``validation/generation.npz``, hashed in the manifest like every file. :func:`evaluate` then
generates from the folder with ``onnxruntime_genai`` and compares: the same call judges the build and
``infopt validate``, which needs no source model.

The budgets are the recipe's ``validation.generation`` (``core.recipe.GenerationBudgets``), with
``--max-drift top1=...,ppl_delta=...`` in their place where given.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from infopt.core.errors import UsageError
from infopt.core.recipe import GenerationBudgets
from infopt.core.safe_load import arrays_file
from infopt.validators import generation

SAMPLES_FILE = "validation/generation.npz"
METRICS = {"top1": ("min", "min_top1", "top-1 agreement with the unquantized model under teacher forcing"),
           "ppl_delta": ("max", "max_ppl_delta", "relative perplexity increase over the unquantized model")}
"""each figure a budget holds: its direction, its field of GenerationBudgets, what it means"""
FIX = ("an INT4 build: calibrate with --calib TEXT.txt (GPTQ, and the layers that hurt most go to 8 bits until the "
       "budget holds on text held out of it); or build --int8; or set the budget with --max-drift "
       "top1=...,ppl_delta=...; a model with random weights agrees little, its logits being nearly flat")


@dataclass
class GenerationSamples:
    """The prompts and held-out text a generation build is judged on, with the unquantized model's answers."""

    prompts: list[list[int]]
    reference_tokens: list[list[int]]
    """transformers' greedy tokens after each prompt (FP32)"""
    held_out: list[list[int]]
    reference_top1: list[np.ndarray]
    """per held-out sequence, the FP32 model's top-1 token at each position"""
    reference_nll: list[np.ndarray]
    """per held-out sequence, the FP32 model's negative log-likelihood of each next token"""
    prompt_source: str = ""
    held_out_source: str = ""
    forced_on_prompts: bool = False
    """the prompts are the first teacher-forced sequences (``held_out`` starts with them): their figures come from
    the logits of the greedy check's prefill, on the model and on the folder, no run for them alone; the sequences
    after them are run as every held-out sequence is"""

    @property
    def new_tokens(self) -> int:
        return len(self.reference_tokens[0]) if self.reference_tokens else 0

    @classmethod
    def from_model(cls, lm, prompts: list[list[int]], prompt_source: str, held_out: list[list[int]],
                   held_out_source: str, new_tokens: int, end_tokens: list[int] | None = None,
                   on_prompts: bool = False) -> "GenerationSamples":
        """``end_tokens``: the ids the folder stops at (``genai_folder.end_tokens``), never picked before the last
        new token, by the reference as by the folder. ``on_prompts``: the prompts' prefill gives the first
        teacher-forced figures, ``held_out`` the rest (:attr:`forced_on_prompts`)."""
        top1, nlls = generation.eager_figures(lm, held_out)
        if not on_prompts:
            return cls(prompts, generation.generate_eager(lm, prompts, new_tokens, end_tokens), held_out, top1, nlls,
                       prompt_source, held_out_source)
        tokens, prompt_top1, prompt_nlls = generation.greedy_eager_figures(lm, prompts, new_tokens, end_tokens)
        return cls(prompts, tokens, prompts + held_out, prompt_top1 + top1, prompt_nlls + nlls, prompt_source,
                   held_out_source if held_out else prompt_source, forced_on_prompts=True)

    def save(self, path: Path) -> int:
        """Write the samples (ragged lists flattened with their lengths); returns how many prompts."""
        path.parent.mkdir(parents=True, exist_ok=True)
        np.savez(path, **_ragged("prompts", self.prompts), reference_tokens=np.asarray(self.reference_tokens, np.int64),
                 **_ragged("held_out", self.held_out), reference_top1=np.concatenate(self.reference_top1).astype(np.int64),
                 reference_nll=np.concatenate(self.reference_nll).astype(np.float64),
                 sources=np.asarray([self.prompt_source, self.held_out_source]),
                 forced_on_prompts=np.asarray(self.forced_on_prompts))
        return len(self.prompts)

    @classmethod
    def load(cls, path: Path) -> "GenerationSamples":
        data = arrays_file(path)
        held_out = _unragged(data, "held_out")
        lengths = [len(ids) for ids in held_out]
        top1 = np.split(data["reference_top1"], np.cumsum(lengths)[:-1])
        nll = np.split(data["reference_nll"], np.cumsum([n - 1 for n in lengths])[:-1])
        sources = [str(s) for s in data["sources"]]
        on_prompts = bool(data["forced_on_prompts"]) if "forced_on_prompts" in data else False
        return cls(_unragged(data, "prompts"), data["reference_tokens"].tolist(), held_out, top1, nll, *sources,
                   forced_on_prompts=on_prompts)


def _ragged(name: str, rows: list[list[int]]) -> dict[str, np.ndarray]:
    return {f"{name}.ids": np.asarray([t for row in rows for t in row], np.int64),
            f"{name}.lengths": np.asarray([len(row) for row in rows], np.int64)}


def _unragged(data, name: str) -> list[list[int]]:
    ids, lengths = data[f"{name}.ids"], data[f"{name}.lengths"]
    return [part.tolist() for part in np.split(ids, np.cumsum(lengths)[:-1])]


def with_max_drift(budgets: GenerationBudgets | None, max_drift: str | None) -> GenerationBudgets:
    """The recipe's budgets, with those ``--max-drift`` gives (``top1=0.9,ppl_delta=0.05``) in their place."""
    limits = (budgets or GenerationBudgets()).model_dump()
    fix = ("write METRIC=VALUE[,METRIC=VALUE] with METRIC top1 (agreement, at least) or ppl_delta (relative "
           "perplexity increase over FP32, at most), e.g. --max-drift top1=0.9,ppl_delta=0.05")
    for part in filter(None, (p.strip() for p in (max_drift or "").split(","))):
        metric, sep, value = part.partition("=")
        if not sep or metric.strip() not in METRICS:
            raise UsageError(f"--max-drift {part!r} names no metric of --task text-generation", fix=fix)
        try:
            limits[METRICS[metric.strip()][1]] = float(value)
        except ValueError:
            raise UsageError(f"--max-drift {part!r}: {value!r} is not a number", fix=fix) from None
    return GenerationBudgets(**limits)


def describe(budgets: GenerationBudgets, forced_only: bool = False) -> str:
    """The budgets in words: ``top1 >= 0.8, ppl_delta <= 0.1``, ``greedy tokens equal`` (with ``forced_only``, the
    teacher-forced ones alone, possibly none)."""
    parts = [f"{m} {'>=' if way == 'min' else '<='} {getattr(budgets, field):g}"
             for m, (way, field, _) in METRICS.items() if getattr(budgets, field) is not None]
    if forced_only:
        return ", ".join(parts)
    if budgets.greedy_equal:
        parts.insert(0, "greedy tokens equal")
    return ", ".join(parts) or "not judged"


def evaluate(folder: Path, samples: GenerationSamples, budgets: GenerationBudgets) -> dict:
    """Generate from ``folder`` and judge it against the stored answers: the greedy check, the teacher-forced
    figures, and the verdict (``passed``, ``reasons``, ``checks``) under ``budgets``."""
    if samples.forced_on_prompts:
        got, top1, nlls = generation.greedy_folder_figures(folder, samples.prompts, samples.new_tokens)
        rest_top1, rest_nlls = generation.teacher_forced_figures(folder, samples.held_out[len(samples.prompts):])
        candidate = (top1 + rest_top1, nlls + rest_nlls)
    else:
        got = generation.generate_folder(folder, samples.prompts, samples.new_tokens)
        candidate = generation.teacher_forced_figures(folder, samples.held_out)
    greedy = generation.compare_tokens(got, samples.reference_tokens)
    forced = generation.agreement_of(samples.reference_top1, samples.reference_nll, *candidate)
    checks = []
    if budgets.greedy_equal:
        checks.append({"name": "greedy_tokens_equal", "measured": greedy["equal"], "limit": greedy["prompts"],
                       "passed": greedy["equal"] == greedy["prompts"]})
    for metric, (way, field, _) in METRICS.items():
        limit = getattr(budgets, field)
        if limit is not None:
            value = forced[metric]
            checks.append({"name": metric, "measured": value, "limit": limit,
                           "passed": bool(value >= limit if way == "min" else value <= limit),
                           "interval": forced.get(f"{metric}_interval")})
    reasons = [_reason(c, forced["tokens"]) for c in checks if not c["passed"]]
    return {"greedy": greedy, "teacher_forced": forced,
            "verdict": {"passed": not reasons, "reasons": reasons, "checks": checks}}


NOT_TIMED = "its logits are not finite, so it stops generating at once"


def finite(judged: dict) -> bool:
    """Whether the folder's teacher-forced perplexity is a finite number. A folder whose logits are not (an overflow
    in its ops) stops generating at its first token, and has no speed to time."""
    return bool(np.isfinite(judged["teacher_forced"]["ppl"]))


OVERFLOW = ("the folder's figures are not finite: an activation beyond float16's range (65,504) overflows the quantized "
            "ops, which compute in float16 with float16 scales; --float32-scales keeps them in float32")
"""the reason a failed verdict adds where the folder's ops compute in float16 (``half_scales``) and :func:`finite` is
not"""


def not_timed(new_tokens: int) -> dict:
    """The timing figures of a folder that cannot be timed (:func:`finite`): none, and why."""
    return {"ttft": [], "tpot": [], "new_tokens": new_tokens, "tpot_prompt_tokens": 0, "left_out": [],
            "not_timed": NOT_TIMED}


def evaluate_in(worker, folder: Path, samples: GenerationSamples, budgets: GenerationBudgets) -> dict:
    """:func:`evaluate` in ``worker`` (``generation.judging_worker``), the folder opened there first."""
    worker.call(generation.hold_open, folder, doing="opening the GenAI folder with onnxruntime_genai")
    return worker.call(evaluate, folder, samples, budgets, doing="generating from the GenAI folder with onnxruntime_genai")


def _reason(check: dict, tokens: int) -> str:
    if check["name"] == "greedy_tokens_equal":
        return (f"greedy tokens equal on {check['measured']} of {check['limit']} prompts: the folder generates other "
                "tokens than the source model")
    way, _, meaning = METRICS[check["name"]]
    said = f"{check['name']} {check['measured']:.4g} {'<' if way == 'min' else '>'} {check['limit']:g} ({meaning})"
    return f"{said}{_undecided(check, tokens)}; {FIX}"


def _undecided(check: dict, tokens: int) -> str:
    """Where the figure's 95 % interval holds the limit: the text judged cannot tell, and how much more could."""
    low, high = check.get("interval") or (None, None)
    if low is None or not low <= check["limit"] <= high or not tokens:
        return ""
    needed = generation.tokens_to_narrow((low, high), tokens)
    more = (f"; about {needed:,} teacher-forced tokens of --val text ({needed / tokens:.1f}x as much) narrow it to "
            f"+/- {generation.WANTED_HALF_WIDTH * 100:g} points" if needed else "")
    return (f", but its 95 % interval ({low:.4g} to {high:.4g}) holds the limit: {tokens:,} tokens of --val text cannot "
            f"tell{more}")
