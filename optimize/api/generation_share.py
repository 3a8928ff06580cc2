"""How much of a text-generation build is judged: a model past :data:`JUDGED_PARAMETERS` parameters, whose every
judged token costs more, on a share of the samples, never below a floor, and the notes that say so with the 95 %
intervals reached."""

from __future__ import annotations

from infopt.report.markdown import ppl_text, top1_text
from infopt.validators import generation

NEW_TOKENS = 16
"""tokens generated per prompt by the greedy check and the TPOT timing"""
JUDGED_PARAMETERS = 1e8
"""models of up to this many parameters are judged on every sample. A larger one, whose every judged token costs
more, on a part of them: a share of the greedy check's :data:`NEW_TOKENS` (this over its parameters, at least
:data:`MIN_NEW_TOKENS`) and :func:`forced_tokens` teacher-forced tokens (the prompts' first), the report giving
top-1 agreement's and the perplexity change's 95 % intervals"""
MIN_NEW_TOKENS = 8
MIN_FORCED_TOKENS = 256
"""the fewest teacher-forced tokens a teacher-forced budget (``top1``, ``ppl_delta``) judges a model on. The first
are the greedy check's prompts', from the logits of their prefill on the model and on the folder
(``GenerationSamples.forced_on_prompts``), no run for them alone; held-out lines after the prompts' make up the
rest. Where no such budget judges the build (float32: its greedy tokens must equal the model's), its figures are the
prompts' alone"""
FORCED_PARAMETER_TOKENS = 3e11
"""past :data:`JUDGED_PARAMETERS`, a teacher-forced budget judges this many parameter-tokens (a token costs a
forward of the model in the reference and one in the folder, as a token of the build's own work does, so the
judging keeps about the same part of the build at every size), never fewer than :data:`MIN_FORCED_TOKENS`:
2,200 tokens at 135M, 600 at 0.5B, the floor from 1.2B on; the interval the judging reached is reported with it"""
WANTED_PPL_HALF_WIDTH = generation.WANTED_HALF_WIDTH
"""the perplexity change's 95 % interval a judging aims at, +/- this; the report says how many held-out tokens a
wider one would have needed"""


def judged_share(parameters: int) -> float:
    return min(1.0, JUDGED_PARAMETERS / max(parameters, 1))


def judged_tokens(parameters: int) -> int:
    """The greedy check's tokens per prompt for a model of ``parameters`` (:data:`JUDGED_PARAMETERS`)."""
    return min(NEW_TOKENS, max(MIN_NEW_TOKENS, round(NEW_TOKENS * judged_share(parameters))))


def forced_tokens(parameters: int) -> int:
    """The teacher-forced tokens a model is judged on (:data:`FORCED_PARAMETER_TOKENS`)."""
    return max(MIN_FORCED_TOKENS, int(FORCED_PARAMETER_TOKENS / max(parameters, 1)))


def judged_sequences(sequences: list[list[int]], parameters: int, counted: int = 0) -> list[list[int]]:
    """The held-out ``sequences`` a model is judged on: the first that hold :func:`forced_tokens` tokens with the
    ``counted`` ones already judged (the prompts'), all where they hold fewer, none where ``counted`` holds them."""
    kept, tokens, wanted = [], counted, forced_tokens(parameters)
    for sequence in sequences:
        if (kept or counted) and tokens >= wanted:
            break
        kept.append(sequence)
        tokens += len(sequence)
    return kept


def judging_share_note(parameters: int, new_tokens: int, kept: int, offered: int, on_prompts: bool,
                       forced: dict) -> str:
    """``on_prompts``: the teacher-forced figures start with the prompts' own (their prefill)."""
    sequences = " and ".join(([] if not on_prompts else ["the prompts' prefill for the teacher-forced figures"])
                             + ([f"{kept} of {sequences_text(offered)}"] if kept or not on_prompts else []))
    return (f"judged on a share of the samples, as the model's {parameters / 1e9:.2f}B parameters cost: "
            f"{new_tokens} greedy tokens a prompt of {NEW_TOKENS}, {sequences}, about {forced_tokens(parameters)} "
            f"teacher-forced tokens (top-1 agreement {top1_text(forced)}, the interval as if the tokens were "
            f"independent; perplexity change {ppl_text(forced)})")


def interval_note(forced: dict) -> str | None:
    """What a perplexity change's interval wider than +/- :data:`WANTED_PPL_HALF_WIDTH` would have needed, or None."""
    interval = forced.get("ppl_delta_interval")
    needed = generation.tokens_to_narrow(interval, forced["tokens"], WANTED_PPL_HALF_WIDTH)
    if needed is None:
        return None
    half = (interval[1] - interval[0]) / 2
    return (f"the perplexity change is known to +/- {half * 100:.1f} points (95 %) over {forced['tokens']} tokens: "
            f"about {needed} held-out tokens would narrow it to +/- {WANTED_PPL_HALF_WIDTH * 100:g} (more or longer "
            f"--val lines)")


def sequences_text(count: int) -> str:
    return f"{count} held-out sequence{'' if count == 1 else 's'}"
