"""Validating and timing a text-generation folder by generating from it with ONNX Runtime GenAI.

- :func:`generate_folder` and :func:`generate_eager`: greedy tokens from the folder and from transformers'
  ``generate`` on the same prompts, every token (an end token held off until the last, so each prompt gives as many);
  :func:`compare_tokens` says where they differ.
- :func:`time_generation`: time to first token (TTFT: the prompt's forward pass and the first token
  picked) at several prompt lengths, and time per output token (TPOT: each further token) at several
  batch sizes, as p50/p99 over repeated runs, with tokens per second.
- :func:`teacher_forced`: each position's logits from the folder for held-out text fed whole, and
  :func:`agreement` of those with the FP32 model's: per-token top-1 agreement and both perplexities.
- :func:`judging_worker`: a worker process that runs these on the folder for a build or ``infopt validate``
  (:func:`hold_open` first), so a crash in ONNX Runtime GenAI's native code is a failed check with its reason.
"""

from __future__ import annotations

import json
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from infopt.core.bf16_compute import float32_blocks
from infopt.core.errors import UsageError
from infopt.core.threads import thread_cap
from infopt.runtime.worker import Worker, huge_pages_env

RUNS = 5
"""timed runs per row at most (a TTFT row's runs are its samples; a TPOT row's each give a sample per token)"""
BUDGET_S = 10.0
"""seconds the timing takes from its first timed run, unless the caller gives another budget (every row still
runs once where the caller asks for every row)"""
TPOT_PROMPT_TOKENS = 32
"""the prompt TPOT is timed after"""
GREEDY_BATCH = 8
"""prompts of one length generated together, by the folder and by transformers' ``generate`` alike: the greedy
check then costs about one prompt's generation (at 0.5B in bf16, 4 prompts one at a time took 7.4 s, together
2.2 s with the same tokens)"""
LOGIT_BYTES = 128 << 20
"""teacher-forced sequences of one length run together while their float32 logits fit in this"""


def same_length_batches(rows: list[list[int]], max_rows: int, max_tokens: int | None = None) -> list[list[int]]:
    """Indices of ``rows`` in groups of one length: at most ``max_rows`` a group and, where ``max_tokens`` is given,
    at most that many tokens (a longer row goes alone). Results placed back by index keep the rows' order."""
    by_length: dict[int, list[int]] = {}
    for i, row in enumerate(rows):
        by_length.setdefault(len(row), []).append(i)
    out = []
    for length, indices in by_length.items():
        size = max(1, min(max_rows, (max_tokens // max(length, 1)) if max_tokens else max_rows))
        out += [indices[k:k + size] for k in range(0, len(indices), size)]
    return out


def _logit_rows(vocab: int) -> int:
    """Tokens of teacher-forced logits held at once (:data:`LOGIT_BYTES`)."""
    return max(1, LOGIT_BYTES // (4 * max(vocab, 1)))


def text_ids(path: str | Path, folder: Path, flag: str, lines_kept: int, tokens: int,
             min_tokens: int = 1, skip: int = 0) -> list[list[int]]:
    """The first ``lines_kept`` lines of a text file that give at least ``min_tokens`` tokens through the
    folder's tokenizer, each cut to ``tokens``, after its first ``skip`` non-blank lines (possibly none then); a clear
    error for a file that is not text, or gives none with nothing skipped."""
    path = Path(path)
    if path.suffix.lower() != ".txt" or not path.is_file():
        raise UsageError(f"{flag} for text generation is a text file, one passage per line; got {path}",
                         where=str(path), fix="pass a .txt file")
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    lines = [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    found = [ids[:tokens] for ids in (tokenizer(line)["input_ids"] for line in lines[skip:])
             if len(ids) >= min_tokens][:lines_kept]
    if not found and not skip:
        raise UsageError(f"{path} gives no line of {min_tokens} token{'s' if min_tokens > 1 else ''} or more",
                         where=str(path), fix="pass a text file with one passage per line")
    return found


_OPENED: dict[Path, Any] = {}
"""folders held open by :func:`hold_open`, whose model every function here reuses for the process's life (opening
a large decoder takes seconds, and memory)"""


def hold_open(folder: Path) -> None:
    """Open the folder's model now and keep it for every later call in this process: a judging worker's first
    call (:func:`judging_worker`)."""
    import onnxruntime_genai as og

    _OPENED[Path(folder).resolve()] = None
    open_folder(og, folder)


def judging_worker() -> Worker:
    """A worker process for the functions here on a GenAI folder (``Worker.call``: :func:`hold_open`, then the
    judging and the timing), ONNX Runtime GenAI imported as it starts. Its native code can end the process that
    runs it; there, that ends the worker, and the check fails saying with which signal. Started with huge-page
    ``malloc`` (``runtime.worker.huge_pages_env``): opening a large decoder repacks all its weights."""
    return Worker(("onnxruntime_genai", "infopt.validators.generation_eval"), env=huge_pages_env(),
                  fix="ONNX Runtime GenAI's native code crashed on this folder: report the lines above with "
                      "`infopt doctor`'s output; build --task logits meanwhile",
                  memory_fix="judge it on a machine with more memory, or build a smaller precision (--int4 holds about "
                             "an eighth of float32's weights); INFOPT_WORKER_MEMORY caps a worker on a shared machine")


def open_folder(og, folder: Path):
    """``onnxruntime_genai.Model`` of the folder as its ``genai_config.json`` says, but for the decoder's threads
    when ``$INFOPT_THREADS`` caps infopt's own runs (then the figures are for that many threads)."""
    key = Path(folder).resolve()
    if _OPENED.get(key) is not None:
        return _OPENED[key]
    cap = thread_cap()
    if cap:
        config = og.Config(str(folder))
        config.overlay(json.dumps({"model": {"decoder": {"session_options": {"intra_op_num_threads": cap}}}}))
    model = og.Model(config if cap else str(folder))
    if key in _OPENED:
        _OPENED[key] = model
    return model


def new_generator(og, model, prompts: np.ndarray, new_tokens: int):
    """A greedy generator for ``prompts`` [batch, length] and exactly ``new_tokens`` more (prompt not yet fed)."""
    params = og.GeneratorParams(model)
    total = prompts.shape[1] + new_tokens
    params.set_search_options(max_length=total, min_length=total, do_sample=False, batch_size=prompts.shape[0])
    return og.Generator(model, params)


def generate_folder(folder: Path, prompts: list[list[int]], new_tokens: int) -> list[list[int]]:
    """Greedy continuations from the GenAI folder, the prompts of one length together."""
    return _greedy_folder(folder, prompts, new_tokens)[0]


def greedy_folder_figures(folder: Path, prompts: list[list[int]], new_tokens: int):
    """:func:`generate_folder`, and the teacher-forced figures (:func:`figures`) of each prompt from the logits of
    its own prefill, which the folder returns for every position: ``(tokens, top1s, nlls)``."""
    return _greedy_folder(folder, prompts, new_tokens, figured=True)


def _greedy_folder(folder: Path, prompts: list[list[int]], new_tokens: int, figured: bool = False):
    import onnxruntime_genai as og

    model = open_folder(og, folder)
    out: list[list[int]] = [[] for _ in prompts]
    top1: list[np.ndarray] = [np.empty(0)] * len(prompts)
    nlls: list[np.ndarray] = [np.empty(0)] * len(prompts)
    for batch in same_length_batches(prompts, GREEDY_BATCH):
        generator = _generator(og, model, np.asarray([prompts[i] for i in batch], dtype=np.int32), new_tokens)
        if figured:
            logits = np.asarray(generator.get_output("logits"), dtype=np.float32)
            for row, i in enumerate(batch):
                top1[i], nlls[i] = figures(logits[row, :len(prompts[i])], prompts[i])
            del logits
        while not generator.is_done():
            generator.generate_next_token()
        for row, i in enumerate(batch):
            out[i] = [int(t) for t in generator.get_sequence(row)][len(prompts[i]):]
    return out, top1, nlls


def _generator(og, model, prompts: np.ndarray, new_tokens: int):
    generator = new_generator(og, model, prompts, new_tokens)
    generator.append_tokens(prompts)
    return generator


def generate_eager(model, prompts: list[list[int]], new_tokens: int,
                   end_tokens: list[int] | None = None) -> list[list[int]]:
    """Greedy continuations from the transformers model (its own ``generate``), the prompts of one length
    together (no padding): the argmax at every step, as the GenAI folder decodes, whatever the checkpoint's
    ``generation_config.json`` asks for (a chat model's sampling and repetition penalty, which a plain
    ``generate(do_sample=False)`` still applies, changing the tokens). ``end_tokens``: the ids the folder stops at
    (the model's generation config's where not given), never picked before ``new_tokens``, as on the folder."""
    return _greedy_eager(model, prompts, new_tokens, end_tokens)[0]


def greedy_eager_figures(model, prompts: list[list[int]], new_tokens: int, end_tokens: list[int] | None = None):
    """:func:`generate_eager`, and each prompt's teacher-forced figures (:func:`figures`) from the logits of its
    prefill, the model's first call of each ``generate`` (asked for every position's logits, not the last one's):
    ``(tokens, top1s, nlls)``, as :func:`greedy_folder_figures` gives them from the folder."""
    return _greedy_eager(model, prompts, new_tokens, end_tokens, figured=True)


def _greedy_eager(model, prompts: list[list[int]], new_tokens: int, end_tokens: list[int] | None,
                  figured: bool = False):
    import inspect

    import torch
    from transformers import GenerationConfig

    stored = model.generation_config
    ends = list(end_tokens) if end_tokens else stored.eos_token_id
    neutral = GenerationConfig(bos_token_id=stored.bos_token_id, eos_token_id=ends, pad_token_id=_pad(model.config))
    greedy = GenerationConfig(do_sample=False, num_beams=1, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                              bos_token_id=stored.bos_token_id, eos_token_id=ends, pad_token_id=_pad(model.config))
    every_position = ({"logits_to_keep": 0} if figured and "logits_to_keep" in inspect.signature(model.forward).parameters
                      else {})
    out: list[list[int]] = [[] for _ in prompts]
    top1: list[np.ndarray] = [np.empty(0)] * len(prompts)
    nlls: list[np.ndarray] = [np.empty(0)] * len(prompts)
    pending: list[list[int]] = []  # the batch whose prefill is the model's next call

    def prefill(_module, _inputs, output) -> None:
        if pending:
            logits = output.logits if hasattr(output, "logits") else output[0]
            for row, i in enumerate(pending.pop()):
                top1[i], nlls[i] = figures(logits[row, :len(prompts[i])].float().numpy(), prompts[i])

    hook = model.register_forward_hook(prefill) if figured else None
    try:
        with generation_settings(model, neutral), torch.inference_mode(), tall_products(model), float32_blocks(model):
            for batch in same_length_batches(prompts, GREEDY_BATCH):
                ids = torch.tensor([prompts[i] for i in batch], dtype=torch.long)
                pending[:] = [batch]
                seq = model.generate(ids, attention_mask=torch.ones_like(ids), generation_config=greedy,
                                     **every_position)
                for row, i in enumerate(batch):
                    out[i] = seq[row, ids.shape[1]:].tolist()
    finally:
        if hook is not None:
            hook.remove()
    return out, top1, nlls


TALL_PRODUCT_ROWS = 16
"""a float32 Linear on the CPU given at most this many rows (a decode step of a few prompts) computes
``weight @ x.T`` (:func:`tall_products`)"""


@contextmanager
def tall_products(model):
    """While the block runs, the float32 ``nn.Linear`` layers of ``model`` given 2 to :data:`TALL_PRODUCT_ROWS` rows on
    the CPU compute ``(weight @ x.T).T``, the same product with the weight on the left. torch's ``F.linear`` hands
    such a product to MKL's sgemm with the weight transposed, which reads a large head several times slower than
    the other way round, and the reference's greedy decode is faster with it, with the same tokens (measured in
    benchmarks/results/rules.md). The sums are float32's in another order, as any runtime's are."""
    import torch

    def forward(layer, x):
        rows = x.numel() // max(x.shape[-1], 1)
        if 1 < rows <= TALL_PRODUCT_ROWS and x.dtype == layer.weight.dtype == torch.float32 and x.device.type == "cpu":
            y = torch.mm(layer.weight, x.reshape(rows, x.shape[-1]).t()).t()
            if layer.bias is not None:
                y = y + layer.bias
            return y.reshape(*x.shape[:-1], layer.weight.shape[0])
        return torch.nn.functional.linear(x, layer.weight, layer.bias)

    layers = [m for m in model.modules() if type(m) is torch.nn.Linear and "forward" not in vars(m)]
    for layer in layers:
        layer.forward = forward.__get__(layer)
    try:
        yield
    finally:
        for layer in layers:
            del layer.forward


def first_token_id(config, *names: str) -> int:
    """The first of ``config``'s token ids ``names`` that is set (of a list, its first), else 0."""
    for name in names:
        value = getattr(config, name, None)
        if isinstance(value, (list, tuple)):
            value = value[0] if value else None
        if value is not None:
            return int(value)
    return 0


def _pad(config) -> int:
    return first_token_id(config, "pad_token_id", "eos_token_id")


@contextmanager
def generation_settings(model, config):
    """``model.generation_config`` (what ``generate`` fills unset settings from) set to ``config`` for the block, so
    nothing of the checkpoint's (a chat model's sampling, its repetition penalty) applies; the checkpoint's after."""
    stored = model.generation_config
    model.generation_config = config
    try:
        yield
    finally:
        model.generation_config = stored


def first_difference(got: list[int], want: list[int]) -> int:
    """The first position where the two token lists differ; where one is the other's start (a folder that stopped
    early, at an end token), the shorter one's length."""
    return next((j for j, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))


def compare_tokens(got: list[list[int]], want: list[list[int]]) -> dict:
    """How many prompts' tokens ``got`` equal those ``want``, every token; the first few that differ, and where."""
    new_tokens = len(want[0]) if want else 0
    differ = [{"prompt": i, "at_token": first_difference(g, w), "eager": w, "deployed": g}
              for i, (g, w) in enumerate(zip(got, want)) if g != w]
    return {"prompts": len(want), "new_tokens": new_tokens, "equal": len(want) - len(differ),
            "differences": differ[:3]}


def teacher_forced(folder: Path, sequences: list[list[int]]) -> list[np.ndarray]:
    """Logits ``[len, vocab]`` at every position of each sequence, from the folder (the prompt's pass of
    ONNX Runtime GenAI, which returns them all), the sequences of one length together. All of them held: for the
    judging, :func:`teacher_forced_figures` keeps each sequence's figures only."""
    out: list[np.ndarray] = [np.empty(0)] * len(sequences)
    for i, logits in _folder_logits(folder, sequences):
        out[i] = logits.copy()
    return out


def teacher_forced_figures(folder: Path, sequences: list[list[int]]) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Each sequence's top-1 tokens and next-token NLLs (:func:`figures`) from the folder, its logits let go batch
    by batch: whole, 32 sequences of 128 tokens at a 152K vocabulary are 2.5 GB of float32."""
    return _figures_of(_folder_logits(folder, sequences), sequences)


def _folder_logits(folder: Path, sequences: list[list[int]]):
    """``(index, logits [len, vocab])`` of each sequence from the folder, a batch of one length at a time."""
    import onnxruntime_genai as og

    model = open_folder(og, folder)
    vocab = json.loads((Path(folder) / "genai_config.json").read_text())["model"]["vocab_size"]
    for batch in same_length_batches(sequences, len(sequences), _logit_rows(vocab)):
        length = len(sequences[batch[0]])
        generator = _generator(og, model, np.asarray([sequences[i] for i in batch], dtype=np.int32), 1)
        logits = np.asarray(generator.get_output("logits"), dtype=np.float32)
        del generator
        for row, i in enumerate(batch):
            yield i, logits[row, :length]


def eager_logits(model, sequences: list[list[int]]) -> list[np.ndarray]:
    """The same from the transformers model."""
    out: list[np.ndarray] = [np.empty(0)] * len(sequences)
    for i, logits in _eager_logits(model, sequences):
        out[i] = logits.copy()
    return out


def eager_figures(model, sequences: list[list[int]]) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """:func:`teacher_forced_figures` from the transformers model."""
    return _figures_of(_eager_logits(model, sequences), sequences)


def _eager_logits(model, sequences: list[list[int]]):
    import torch

    with torch.inference_mode(), float32_blocks(model):
        for batch in same_length_batches(sequences, len(sequences), _logit_rows(model.get_output_embeddings().weight.shape[0])):
            ids = torch.tensor([sequences[i] for i in batch])
            logits = model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits
            for row, i in enumerate(batch):
                yield i, logits[row].float().numpy()


def figures(logits: np.ndarray, ids: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """What the teacher-forced figures are computed from, of one sequence: the top-1 token at each position and
    each next token's negative log-likelihood."""
    return logits.argmax(-1), nll(logits, ids)


def _figures_of(pairs, sequences: list[list[int]]) -> tuple[list[np.ndarray], list[np.ndarray]]:
    top1: list[np.ndarray] = [np.empty(0)] * len(sequences)
    nlls: list[np.ndarray] = [np.empty(0)] * len(sequences)
    for i, logits in pairs:
        top1[i], nlls[i] = figures(logits, sequences[i])
    return top1, nlls


def nll(logits: np.ndarray, ids: list[int]) -> np.ndarray:
    """Each next token's negative log-likelihood under the logits before it: the log of the sum of exponentials
    less the token's logit, the exponentials in float32 (shifted by the row's largest) and summed in float64
    (within 1e-7 of a float64 computation, a third of its time at a 152K vocabulary)."""
    z = logits[:-1]
    top = z.max(-1, keepdims=True)
    log_sum = np.log(np.exp(z - top).sum(-1, dtype=np.float64)) + top[:, 0]
    return log_sum - z[np.arange(len(ids) - 1), np.asarray(ids[1:])]


def agreement(reference: list[np.ndarray], candidate: list[np.ndarray], sequences: list[list[int]]) -> dict:
    """Per-token top-1 agreement of ``candidate`` with ``reference`` (every position), and the perplexity of
    each on the next tokens; ``ppl_delta`` is the candidate's relative increase (0.05 is 5 %)."""
    return agreement_of(*_figures_of(enumerate(reference), sequences), *_figures_of(enumerate(candidate), sequences))


def agreement_of(reference_top1: list[np.ndarray], reference_nll: list[np.ndarray], candidate_top1: list[np.ndarray],
                 candidate_nll: list[np.ndarray]) -> dict:
    """:func:`agreement` from both sides' figures (:func:`figures`); ``top1_interval`` is top-1 agreement's 95 %
    interval as if the tokens were independent (:func:`wilson_interval`; neighbouring tokens are not quite)."""
    same = np.concatenate([np.asarray(r) == np.asarray(c) for r, c in zip(reference_top1, candidate_top1)])
    nll_ref, nll_new = np.concatenate(reference_nll), np.concatenate(candidate_nll)
    ppl_ref, ppl_new = float(np.exp(nll_ref.mean())), float(np.exp(nll_new.mean()))
    top1 = float(same.mean())
    return {"sequences": len(reference_top1), "tokens": int(same.size), "top1": top1,
            "top1_interval": list(wilson_interval(top1, int(same.size))),
            "ppl_reference": ppl_ref, "ppl": ppl_new, "ppl_delta": ppl_new / ppl_ref - 1.0,
            "ppl_delta_interval": list(ppl_delta_interval(reference_nll, candidate_nll))}


RUN_TOKENS = 32
"""consecutive tokens of one sequence taken as one sample by :func:`ppl_delta_interval`: a token's loss change is
not independent of its neighbours', runs of this many nearly are"""


def ppl_delta_interval(reference_nll: list[np.ndarray], candidate_nll: list[np.ndarray],
                       z: float = 1.96) -> tuple[float, float]:
    """The 95 % interval of the perplexity change ``exp(mean(candidate - reference)) - 1``: each token's change in
    log-likelihood, the same token on both sides (paired), summed over runs of :data:`RUN_TOKENS` consecutive
    tokens of a sequence, the mean's standard error from the spread of those runs. Under two runs it is the
    change itself, unbounded either way."""
    runs, counts = [], []
    for ref, new in zip(reference_nll, candidate_nll):
        change = np.asarray(new, np.float64) - np.asarray(ref, np.float64)
        for start in range(0, change.size, RUN_TOKENS):
            part = change[start:start + RUN_TOKENS]
            runs.append(part.sum())
            counts.append(part.size)
    runs_a, counts_a = np.asarray(runs), np.asarray(counts, np.float64)
    total = counts_a.sum()
    if runs_a.size < 2 or total == 0:
        return -1.0, float("inf")
    mean = runs_a.sum() / total
    # the ratio estimator's variance: the runs' deviations from the mean change, as many as there are runs
    spread = float(np.sqrt(((runs_a - mean * counts_a) ** 2).sum() * runs_a.size / (runs_a.size - 1))) / total
    return float(np.expm1(mean - z * spread)), float(np.expm1(mean + z * spread))


WANTED_HALF_WIDTH = 0.02
"""the half-width of the perplexity change's 95 % interval a judging aims at: +/- 2 points"""


def tokens_to_narrow(interval, tokens: int, half_width: float = WANTED_HALF_WIDTH) -> int | None:
    """The tokens that would narrow ``interval`` (a figure's 95 % interval over ``tokens``) to +/- ``half_width``:
    intervals narrow as the square root of the tokens. None where it is that narrow already, or unbounded."""
    low, high = interval or (None, None)
    if low is None or high == float("inf") or not tokens:
        return None
    half = (high - low) / 2
    return int(np.ceil(tokens * (half / half_width) ** 2)) if half > half_width else None


def wilson_interval(share: float, count: int, z: float = 1.96) -> tuple[float, float]:
    """The 95 % (Wilson score) interval of a share measured over ``count`` trials; it stays inside 0..1, holds the
    share itself (at a share of 1 the bound's rounding can fall just below it), and is not empty where every trial
    agreed."""
    if count <= 0:
        return 0.0, 1.0
    scale = 1.0 + z * z / count
    center = (share + z * z / (2 * count)) / scale
    half = z / scale * float(np.sqrt(share * (1.0 - share) / count + z * z / (4 * count * count)))
    return max(0.0, min(share, center - half)), min(1.0, max(share, center + half))


def usd_per_million(price_per_hour: float | None, tokens_per_s: float) -> float | None:
    """What a million output tokens cost on a machine billed ``price_per_hour`` (USD) producing
    ``tokens_per_s`` all the time; None without a price."""
    if not price_per_hour or tokens_per_s <= 0:
        return None
    return price_per_hour / 3600 / tokens_per_s * 1e6


@dataclass
class Timed:
    p50_ms: float
    p99_ms: float
    runs: int
    samples: int


def _summary(seconds: list[float], runs: int) -> Timed:
    ms = np.asarray(seconds) * 1e3
    return Timed(float(np.percentile(ms, 50)), float(np.percentile(ms, 99)), runs, len(ms))


def first_token_seconds(og, model, ids: np.ndarray) -> float:
    """TTFT: the prompt's pass and the first token picked, for ``ids`` [batch, length]."""
    start = time.perf_counter()
    generator = _generator(og, model, ids, 1)
    generator.get_next_tokens()
    return time.perf_counter() - start


def token_seconds(og, model, ids: np.ndarray, new_tokens: int) -> list[float]:
    """TPOT samples: the time of each token after the first, generating ``new_tokens`` after ``ids``."""
    generator = _generator(og, model, ids, new_tokens)
    generator.generate_next_token()  # the first token comes from the prompt's pass
    steps = []
    while not generator.is_done():
        start = time.perf_counter()
        generator.generate_next_token()
        steps.append(time.perf_counter() - start)
    return steps


def held_first_token_seconds(folder: Path, ids: np.ndarray) -> float:
    """:func:`first_token_seconds` of the folder this process holds open (:func:`hold_open`): a worker's call."""
    import onnxruntime_genai as og

    return first_token_seconds(og, open_folder(og, folder), ids)


def held_per_token_seconds(folder: Path, ids: np.ndarray, new_tokens: int) -> float:
    """:func:`per_token_seconds` of the folder this process holds open (:func:`hold_open`): a worker's call."""
    import onnxruntime_genai as og

    return per_token_seconds(og, open_folder(og, folder), ids, new_tokens)


def per_token_seconds(og, model, ids: np.ndarray, new_tokens: int) -> float:
    """TPOT of one generation: the mean of :func:`token_seconds`."""
    steps = token_seconds(og, model, ids, new_tokens)
    return sum(steps) / max(len(steps), 1)


def time_generation(folder: Path, vocab: int, prompt_lengths: list[int], batch_sizes: list[int],
                    new_tokens: int = 16, seed: int = 0, budget_s: float = BUDGET_S, every_row: bool = True,
                    warm: bool = False) -> dict:
    """TTFT per prompt length (batch 1) and TPOT per batch size (after a prompt of ``TPOT_PROMPT_TOKENS``, or
    the shortest TTFT prompt where that is shorter), from the folder.

    The cost is bounded, whatever the model's size: one warm-up run, then the shortest prompt's TTFT and the
    first batch size's TPOT once, then the other rows once each, the cheapest first (a row's cost predicted from
    those timed: see ``predicted``), then further
    runs, the rows with the fewest first, while ``budget_s`` (counted from the first timed run) lasts (at most
    :data:`RUNS` a row). Without ``every_row``, a row whose one run is predicted past what is left of the budget
    is left out, and ``left_out`` says which and its prediction. Each row says its runs and samples, the figures'
    footing. ``warm``: the folder has just generated in this process (the build's judging), so no warm-up run."""
    import onnxruntime_genai as og

    model = open_folder(og, folder)
    rng = np.random.default_rng(seed)

    def prompt(batch: int, length: int) -> np.ndarray:
        return rng.integers(1, vocab, size=(batch, length)).astype(np.int32)

    tpot_prompt = min(TPOT_PROMPT_TOKENS, prompt_lengths[0])
    if not warm:  # warm-up: the session allocates on its first call
        first_token_seconds(og, model, prompt(1, prompt_lengths[0]))
    rows = [("ttft", n, lambda n=n: [first_token_seconds(og, model, prompt(1, n))]) for n in prompt_lengths]
    rows += [("tpot", b, lambda b=b: token_seconds(og, model, prompt(b, tpot_prompt), new_tokens)) for b in batch_sizes]
    samples: dict[int, list[float]] = {}
    run_s: dict[int, list[float]] = {}
    started = time.perf_counter()

    def run(i: int) -> None:
        began = time.perf_counter()
        samples.setdefault(i, []).extend(rows[i][2]())
        run_s.setdefault(i, []).append(time.perf_counter() - began)

    def predicted(i: int) -> float:
        """One run of row ``i``, from the nearest smaller timed row of its kind: a prompt's pass scaled by its
        tokens, a generation's tokens after it by the square root of the batch (a step reads the weights once
        for the whole batch)."""
        kind, size, _ = rows[i]
        known = [k for k in run_s if rows[k][0] == kind and rows[k][1] <= size]
        if not known:
            return 0.0
        k = max(known, key=lambda k: rows[k][1])
        ratio, seconds = size / rows[k][1], float(np.mean(run_s[k]))
        steps = sum(samples[k]) / len(run_s[k]) if kind == "tpot" else 0.0
        return (seconds - steps) * ratio + steps * ratio ** 0.5

    run(0)
    run(len(prompt_lengths))
    left_out = []
    pending = [i for i in range(len(rows)) if i not in run_s]
    while pending:
        i = min(pending, key=predicted)
        pending.remove(i)
        cost = predicted(i)
        if every_row or time.perf_counter() - started + cost <= budget_s:
            run(i)
        else:
            kind, size, _ = rows[i]
            left_out.append({"kind": kind, ("prompt_tokens" if kind == "ttft" else "batch"): size,
                             "predicted_ms": round(cost * 1e3, 1)})
    timed = sorted(run_s)
    while min(len(run_s[i]) for i in timed) < RUNS:
        i = min(timed, key=lambda k: (len(run_s[k]), k))
        if time.perf_counter() - started + float(np.mean(run_s[i])) > budget_s:
            break
        run(i)
    summary = {i: _summary(samples[i], len(run_s[i])) for i in timed}
    ttft = [{"prompt_tokens": rows[i][1], **vars(summary[i])} for i in timed if rows[i][0] == "ttft"]
    tpot = [{"batch": rows[i][1], **vars(summary[i]), "tokens_per_s": rows[i][1] * 1e3 / summary[i].p50_ms}
            for i in timed if rows[i][0] == "tpot"]
    return {"ttft": ttft, "tpot": tpot, "new_tokens": new_tokens, "tpot_prompt_tokens": tpot_prompt,
            "budget_s": budget_s, "left_out": left_out, **({"warmed_by_judging": True} if warm else {})}
