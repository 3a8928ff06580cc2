"""The release gate's judge for text-generation builds: a candidate GenAI folder against a baseline's.

The gate (``gating.py``) takes the same steps for every build; this judge measures what they ask the
text-generation way. Both folders are run by ``onnxruntime_genai``, the runtime that serves them, each in a worker
process of its own (``generation.judging_worker``): a crash in its native code is the gate's failed ``runtime``
check, not the end of the job. As for every
build, the candidate is first held to its own reference, then to the baseline:

0. the candidate's folder against the FP32 source model's answers its build stored
   (``validation/generation.npz``), judged by the task's evaluator (``validators/generation_eval.py``) against
   its recipe's budgets, as ``infopt validate`` judges it (the ``reference`` checks);
1. accuracy under teacher forcing on the held-out text (``--val``, a text file through the candidate's
   tokenizer; else seeded random token ids, flagged): the candidate's top-1 agreement with the baseline at
   every position (``baseline.min_top1``; by default the candidate's own top-1 budget for builds of the same
   source model, else 0.99), and its perplexity against the baseline's (``generation.max_ppl_increase``,
   relative; by default the candidate's own ``ppl_delta`` budget, else 0.02). Perplexity is gated only on
   text, since on random ids it says nothing;
2. TTFT (a prompt's pass, batch 1) and TPOT (each further token, at ``latency.batch_sizes``, default 1 and 8),
   timed side by side in interleaved trials as every gate times latency (``validators/timing.py``):
   a ratio fails only when its lower confidence bound is above ``latency.max_ratio``.

The model files' size ratio is measured by the gate as for every build; peak memory is not measured for this task.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

import numpy as np

from infopt.core.errors import UsageError
from infopt.core.recipe import Recipe
from infopt.runtime.worker import Worker
from infopt.validators import generation, generation_eval
from infopt.validators.gate_config import GateConfig
from infopt.validators.gate_result import GateCheck, GateResult
from infopt.validators.timing import paired

SERVER = "onnxruntime-genai"
DEFAULT_TOP1, DEFAULT_PPL = 0.99, 0.02
SEQUENCES, TOKENS = 32, 128
TTFT_PROMPT, TPOT_PROMPT, NEW_TOKENS = 128, 32, 16
STEPS = NEW_TOKENS - 1
"""the decode steps a TPOT timing spans (the first token comes from the prompt's pass)"""


def is_generation(manifest) -> bool:
    return SERVER in manifest.artifacts


def folder_of(root: Path, manifest) -> Path:
    return root / manifest.artifacts.get(SERVER)


def _budget(manifest, name: str) -> float | None:
    return next((c["limit"] for c in manifest.validation.verdict.checks
                 if isinstance(c, dict) and c.get("name") == name), None)


class GenerationJudge:
    """The gate's judge for text-generation builds (``gating.judge_for`` picks it): both folders run by
    ``onnxruntime_genai``; accuracy from the task's evaluator and teacher forcing, latency as TTFT and TPOT."""

    task = "text-generation"
    measures_memory = False

    def __init__(self, same_source: bool) -> None:
        self.same_source = same_source
        self.folders: tuple[Path, Path] | None = None
        self.configs: list[dict] = []
        self.workers: dict[str, Worker] = {}
        """each folder's judging worker (``generation.judging_worker``): ONNX Runtime GenAI's native code runs
        there, so a crash is the gate's failed ``runtime`` check"""

    def accuracy(self, result: GateResult, config: GateConfig, cand, base, val: str | Path | None, max_val_samples: int,
                 say: Callable[[str], Any]) -> None:
        """The candidate against its stored reference, then teacher-forced agreement and perplexity against the
        baseline (``max_val_samples`` does not apply: ``--val`` is text, cut into ``SEQUENCES`` sequences)."""
        if not (is_generation(cand.manifest) and is_generation(base.manifest)):
            raise UsageError("a text-generation build is gated against another text-generation build; one of the two "
                             "is not", fix="pass two outputs of `infopt build ... --task text-generation`")
        cand_dir, base_dir = self.folders = folder_of(cand.root, cand.manifest), folder_of(base.root, base.manifest)
        for name, folder in (("candidate", cand_dir), ("baseline", base_dir)):
            self.workers[name] = generation.judging_worker()
            self.workers[name].call(generation.hold_open, folder, doing=f"opening the {name}'s GenAI folder")
        _reference_checks(result, cand.root, cand.manifest, cand_dir, self.workers["candidate"], say)
        self.configs = [json.loads((d / "genai_config.json").read_text())["model"] for d in (cand_dir, base_dir)]
        vocab = self.configs[0]["vocab_size"]
        context = min(c["context_length"] for c in self.configs)
        sequences, source = _sequences(val, cand_dir, vocab, min(TOKENS, context - 1))
        say(f"teacher-forced logits of {len(sequences)} sequences from both folders")
        found = generation.agreement_of(*self._forced("baseline", base_dir, sequences),
                                        *self._forced("candidate", cand_dir, sequences))
        result.measurements.setdefault("generation", {})["teacher_forced"] = {**found, "against": "baseline",
                                                                              "source": source}
        top1 = config.baseline.min_top1
        if top1 is None:
            top1 = (_budget(cand.manifest, "top1") if self.same_source else None) or DEFAULT_TOP1
        result.checks.append(GateCheck("baseline", "top1 (teacher-forced)", found["top1"], None, f">= {top1:g}",
                                       found["top1"] >= top1, f"over {found['tokens']} tokens of {source}"))
        ppl = config.generation.max_ppl_increase
        if ppl is None:
            ppl = (_budget(cand.manifest, "ppl_delta") if self.same_source else None) or DEFAULT_PPL
        text = val is not None
        result.checks.append(GateCheck("baseline", "perplexity increase", found["ppl_delta"], None,
                                       f"<= {ppl:g}" if text else "not gated", found["ppl_delta"] <= ppl if text else None,
                                       f"perplexity {found['ppl']:.4g} vs {found['ppl_reference']:.4g}"
                                       + ("" if text else "; on random token ids (pass --val text to gate it)")))
        result.notes.append("text-generation builds: both folders run by onnxruntime_genai, each in a worker process of its own")

    def _forced(self, name: str, folder: Path, sequences: list[list[int]]):
        return self.workers[name].call(generation.teacher_forced_figures, folder, sequences,
                                       doing=f"teacher-forcing the {name}'s GenAI folder")

    def latency(self, result: GateResult, config: GateConfig, cand, base, say: Callable[[str], Any]) -> None:
        vocab = self.configs[0]["vocab_size"]
        context = min(c["context_length"] for c in self.configs)
        _latency(result, config, self.workers, *self.folders, vocab, context, say)

    def close(self) -> None:
        self.folders = None
        for worker in self.workers.values():
            worker.close()
        self.workers = {}


def _reference_checks(result: GateResult, root: Path, manifest, folder: Path, worker: Worker, say) -> None:
    """The candidate against its own stored reference, under its recipe's budgets (the ``reference`` checks)."""
    stored = root / generation_eval.SAMPLES_FILE
    if not stored.is_file():
        result.notes.append(f"the candidate holds no {generation_eval.SAMPLES_FILE} (built before generation builds "
                            "stored their reference): it was not judged against its source model here")
        return
    say("the candidate against its stored reference (the FP32 source model's answers)")
    budgets = generation_eval.with_max_drift(Recipe.from_json(manifest.recipe).validation.generation, None)
    judged = generation_eval.evaluate_in(worker, folder, generation_eval.GenerationSamples.load(stored), budgets)
    result.measurements["generation"] = {"reference": {"greedy": judged["greedy"],
                                                       "teacher_forced": judged["teacher_forced"]}}
    for check in judged["verdict"]["checks"]:
        name, limit = check["name"], check["limit"]
        rule = (f"== {limit}" if name == "greedy_tokens_equal" else
                f"{'>=' if generation_eval.METRICS[name][0] == 'min' else '<='} {limit:g}")
        result.checks.append(GateCheck("reference", name, check["measured"], None, rule, check["passed"],
                                       f"on {generation_eval.SAMPLES_FILE}, against the FP32 source model"))


def _sequences(val, folder: Path, vocab: int, length: int) -> tuple[list[list[int]], str]:
    if val is None:
        rng = np.random.default_rng(0)
        return [rng.integers(1, vocab, size=min(64, length)).tolist() for _ in range(8)], "random token ids (no --val)"
    return generation.text_ids(val, folder, "--val", SEQUENCES, length, min_tokens=2), str(val)


def _latency(result: GateResult, config: GateConfig, workers: dict[str, Worker], cand_dir: Path, base_dir: Path,
             vocab: int, context: int, say) -> None:
    """TTFT and TPOT of both folders side by side, each timed in its worker (the pipe is not in the figures)."""
    lat = config.latency
    folders = {"candidate": cand_dir, "baseline": base_dir}
    rng = np.random.default_rng(0)
    ttft_len = min(TTFT_PROMPT, context - 1)
    tpot_len = min(TPOT_PROMPT, context - NEW_TOKENS)

    def ttft(name):
        return lambda feed: workers[name].call(generation.held_first_token_seconds, folders[name], feed["ids"],
                                               doing=f"timing the {name}'s first token")

    def tpot(name):  # the decode steps' whole time: a block then needs few generations to last long enough
        return lambda feed: workers[name].call(generation.held_per_token_seconds, folders[name], feed["ids"], NEW_TOKENS,
                                               doing=f"timing the {name}'s tokens") * STEPS

    runs = [("TTFT", ttft, {1: {"ids": rng.integers(1, vocab, size=(1, ttft_len)).astype(np.int32)}}),
            ("TPOT", tpot, {b: {"ids": rng.integers(1, vocab, size=(b, tpot_len)).astype(np.int32)}
                            for b in (lat.batch_sizes or [1, 8])})]
    estimates = []
    for label, fn, feeds in runs:
        per = STEPS if label == "TPOT" else 1  # the times shown are per token
        for e in paired(fn("candidate"), fn("baseline"), feeds, trials=lat.trials, runs=min(lat.iterations, 3),
                        warmup=min(lat.warmup, 2), confidence=lat.confidence, timer=lambda f, feed: f(feed),
                        progress=lambda text, label=label: say(f"{label} {text}")):
            estimates.append({"figure": label, **e.to_json()})
            passed = None if lat.max_ratio is None else e.lower <= lat.max_ratio
            result.checks.append(GateCheck("latency", f"{label} ratio b{e.batch}", e.ratio, None,
                                           "not gated" if lat.max_ratio is None else f"lower bound <= {lat.max_ratio:g}",
                                           passed, f"median ratio {e.ratio:.3f} over {e.trials} interleaved trials, "
                                           f"bounds [{e.lower:.3f}, {e.upper:.3f}]; median trial "
                                           f"{e.candidate_p50_ms / per:.3f} ms vs {e.baseline_p50_ms / per:.3f} ms"))
    result.measurements["latency"] = {"timer": "host clock, onnxruntime_genai", "estimates": estimates,
                                      "ttft_prompt_tokens": ttft_len, "tpot_prompt_tokens": tpot_len}
