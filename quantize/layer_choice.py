"""Which INT4 layers go to 8 bits, chosen by accuracy: the smallest share that holds the build's budget.

GPTQ measures each unit's output error ``tr(E H E^T)`` as it rounds it (``weight_only.calibrate_int4``); the units
with the largest errors per weight, up to :data:`POOL_SHARE` of the weights, keep their float weights meanwhile. Then
:class:`LayerChoice` runs the rounded model on text the build holds out of calibration (:class:`ChoiceText`),
with the first units of that ranking back in float (8 bits downstream) up to each share of
:data:`CHOICE_SHARES`, and keeps the smallest share whose teacher-forced figures hold the budget, under
``max_bits_per_weight`` where one is given. A budget no share under the cap holds is recorded with the cap that
would hold it, so a failed verdict can say what to pass next.

Bits per weight count what ONNX Runtime's ``MatMulNBits`` stores in the folder: the codes, a float16 scale per group
(``half_scales``) and, on the asymmetric grid, a zero point per group (4 bits for 4-bit codes; the 8-bit grid is
symmetric and stores none).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from infopt.core.errors import UsageError
from infopt.quantize.int4_format import replace_module
from infopt.validators import generation

CHOICE_SHARES = (0.0, 0.05, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5)
"""the shares of the INT4 layers' weights tried in 8 bits, smallest first"""
POOL_SHARE = CHOICE_SHARES[-1]
"""the most weights whose float copies are held while GPTQ rounds the rest (file-backed where the checkpoint maps
them: no resident copy)"""
FIXED_SHARE = 0.1
"""``int8_share: auto`` where no text was held out to choose on: a tenth of the weights (the measured default)"""
PPL_MARGIN = 0.85
"""the share of the perplexity budget a choice may spend on its own text: the verdict judges other text, through
ONNX Runtime's kernels (activations rounded to int8 per block), so a choice at the budget's edge would fail it
about half the time"""
TOP1_MARGIN = 0.01
"""top-1 agreement a choice keeps above the budget's, for the same reason"""
EIGHT_BIT_BLOCK = 32


SCALE_BITS = 16
"""a block's scale as the folder stores it: float16 (``passes/decoder/half_scales.py``; ``--float32-scales`` stores
32 bits, and the folder is then larger than these counts)"""


def stored_bits(bits: int, group_size: int, symmetric: bool = False) -> float:
    """Bits per weight ``MatMulNBits`` stores at ``bits`` per code: the codes, a float16 scale per group, a zero
    point per group on the asymmetric grid."""
    return bits + (SCALE_BITS + (0 if symmetric else bits)) / group_size


INT8_BITS = stored_bits(8, EIGHT_BIT_BLOCK, symmetric=True)
"""the 8-bit grid (``quantize/int8_weights.py``): codes per block of 32, symmetric, llama.cpp Q8_0's 8.5 bits"""
HEAD_BITS = INT8_BITS
"""the output head's (and a tied embedding's) bits per weight in an INT4 text-generation build (``quantize_int8_weights``)"""
EMBEDDING_BITS = 4 + (SCALE_BITS + 8) / 32
"""an untied embedding's bits per entry in an INT4 text-generation build (``quantize_embedding``: 4-bit codes, a
float16 scale and a byte's zero point per block of 32)"""


@dataclass
class EightBitLayers:
    """Layers kept for 8 bits that the module holds in INT4 while it is captured and exported, so its decoder's
    layers stay alike and one is stamped for all (``passes/lower/onnx_stamp.py``): their float Linears by module
    path, which ``onnx_export`` lowers to 8-bit ``MatMulNBits`` in their INT4 layers' place, then puts back in the
    module (:meth:`restore`: the 4-bit checkpoint lists them unquantized). ``Artifact.products``."""

    module: Any
    floats: dict[str, Any]

    def weight(self, path: str):
        """``(weight [out, in], bias or None)`` of the layer at ``path`` (``model.layers.3.mlp.down_proj``), as applied
        to the input its INT4 layer receives in the graph: AWQ's INT4 layer reads ``x / input_scale``, so the float
        weight is scaled by ``input_scale`` to give the same output."""
        layer = self.floats[path]
        weight = layer.weight.detach()
        scale = getattr(self.module.get_submodule(path), "input_scale", None)
        if scale is not None:
            weight = weight * scale.to(weight.dtype)[None, :]
        return weight, None if layer.bias is None else layer.bias.detach()

    def restore(self) -> None:
        for path, layer in self.floats.items():
            replace_module(self.module, path, layer)


@dataclass
class ChoiceText:
    """Windows of text held out of calibration and the source model's figures on them, with the budget."""

    windows: list[list[int]]
    top1: list[np.ndarray]
    nll: list[np.ndarray]
    min_top1: float | None
    max_ppl_delta: float | None
    source: str

    @classmethod
    def from_model(cls, lm, windows: list[list[int]], min_top1: float | None, max_ppl_delta: float | None,
                   source: str) -> "ChoiceText":
        top1, nll = generation.eager_figures(lm, windows)
        return cls(windows, top1, nll, min_top1, max_ppl_delta, source)

    @property
    def tokens(self) -> int:
        return sum(len(w) for w in self.windows)

    def figures(self, lm) -> dict[str, Any]:
        """``lm``'s teacher-forced figures on the windows against the source model's."""
        top1, nll = generation.eager_figures(lm, self.windows)
        return generation.agreement_of(self.top1, self.nll, top1, nll)

    def holds(self, figures: dict[str, Any]) -> bool:
        """Whether ``figures`` hold the budget with the margins (:data:`PPL_MARGIN`, :data:`TOP1_MARGIN`)."""
        return ((self.max_ppl_delta is None or figures["ppl_delta"] <= PPL_MARGIN * self.max_ppl_delta)
                and (self.min_top1 is None or figures["top1"] >= min(1.0, self.min_top1 + TOP1_MARGIN)))

    def budget_text(self) -> str:
        parts = ([f"ppl_delta <= {PPL_MARGIN * self.max_ppl_delta:.3g}"] if self.max_ppl_delta is not None else []) + \
                ([f"top1 >= {self.min_top1 + TOP1_MARGIN:.3g}"] if self.min_top1 is not None else [])
        return ", ".join(parts) or "no budget"


@dataclass
class LayerChoice:
    """The ladder of :data:`CHOICE_SHARES` on :class:`ChoiceText`, under ``max_bits`` (the INT4 layers' average,
    8-bit ones counted at :data:`INT8_BITS`), and what it found."""

    text: ChoiceText
    int4_bits: float
    max_bits: float | None = None
    progress: Callable[[str], None] | None = None
    whole: Callable[[float], float] | None = None
    """the whole model's bits per parameter with the INT4 layers at a given average, every table counted (the size
    target's measure, ``--max-bits-per-weight``); None: the INT4 layers' own average is the measure"""
    rungs: list[dict[str, Any]] = field(default_factory=list)
    chosen: dict[str, Any] | None = None
    would_pass: dict[str, Any] | None = None
    """where no share under the cap held: the smallest above it that did (None: none did)"""

    def bits(self, share: float) -> float:
        return self.int4_bits * (1 - share) + INT8_BITS * share

    def cap_share(self) -> float:
        """The largest share the cap allows."""
        if self.max_bits is None:
            return POOL_SHARE
        return max(0.0, min(POOL_SHARE, (self.max_bits - self.int4_bits) / (INT8_BITS - self.int4_bits)))

    def __call__(self, model, sizes: list[int], total: int, use: Callable[[int], None]) -> int:
        """How many of the ranked units (``sizes``, largest error first, of ``total`` weights) go to 8 bits;
        ``use(k)`` puts the first ``k`` in float and the rest in INT4 in ``model``. Under a size target
        (``max_bits``), as many as it holds; without one, the fewest that hold the budget."""
        cap = self.cap_share()
        counts = _counts(sizes, total, [*(s for s in CHOICE_SHARES if s < cap - 1e-9), cap]
                         if self.max_bits is not None else CHOICE_SHARES)
        allowed = [c for c in counts if c["share"] <= cap + 1e-9]

        def tried(rung: dict) -> bool:
            if "passed" not in rung:
                use(rung["units"])
                if self.progress:
                    self.progress(f"INT4 choice: {rung['share']:.0%} of the weights in 8 bits, judged on "
                                  f"{self.text.tokens} tokens of {self.text.source}")
                started = time.perf_counter()
                figures = self.text.figures(model)
                rung.update(bits=round(self.bits(rung["share"]), 3), top1=figures["top1"],
                            ppl_delta=figures["ppl_delta"], ppl_delta_interval=figures["ppl_delta_interval"],
                            passed=self.text.holds(figures), seconds=round(time.perf_counter() - started, 2))
                self.rungs.append(rung)
            return rung["passed"]

        best = _first_passing(allowed, tried) if self.max_bits is None else \
            (allowed[-1] if allowed and tried(allowed[-1]) else None)
        if best is None:
            above = _counts(sizes, total, [s for s in CHOICE_SHARES if s > cap + 1e-9])
            self.would_pass = _first_passing([c for c in above if c["units"] > allowed[-1]["units"]], tried,
                                             last_first=True)
            best = allowed[-1]
            tried(best)
        self.chosen = best
        self.rungs.sort(key=lambda r: r["share"])
        return best["units"]

    def model_bits(self, share: float) -> float:
        """The size target's measure at ``share`` in 8 bits: the flag's value that keeps that share."""
        bits = self.bits(share)
        return round(self.whole(bits) if self.whole else bits, 3)

    def to_json(self) -> dict[str, Any]:
        chosen = None if self.chosen is None else self.chosen["share"]
        more = None if chosen is None else next((s for s in CHOICE_SHARES if s > chosen + 0.01), None)
        return {"text": self.text.source, "tokens": self.text.tokens, "budget": self.text.budget_text(),
                "max_bits_per_weight": self.max_bits, "int4_bits": round(self.int4_bits, 3),
                "int8_bits": INT8_BITS, "rungs": self.rungs, "chosen": chosen,
                "model_bits": None if chosen is None else self.model_bits(chosen),
                "held": bool(self.chosen and self.chosen.get("passed")),
                "would_pass": None if self.would_pass is None else
                {"share": self.would_pass["share"], "bits": self.would_pass["bits"],
                 "model_bits": self.model_bits(self.would_pass["share"])},
                "more": None if more is None else {"share": more, "model_bits": self.model_bits(more)}}


def _counts(sizes: list[int], total: int, shares=CHOICE_SHARES) -> list[dict[str, Any]]:
    """For each of ``shares``, the most ranked units within it and their actual share (equal unit counts merged)."""
    rungs: dict[int, dict[str, Any]] = {}
    cumulative = np.cumsum([0, *sizes])
    for share in shares:
        units = int(np.searchsorted(cumulative, share * total + 0.5, side="right")) - 1
        rungs.setdefault(units, {"units": units, "share": round(float(cumulative[units]) / max(total, 1), 4)})
    return list(rungs.values())


def _first_passing(rungs: list[dict], tried: Callable[[dict], bool], last_first: bool = False) -> dict | None:
    """The first rung that passes, by bisection (the figures improve as more weights go to 8 bits). The first is
    tried first: where every layer in INT4 holds the budget, as a larger model's often does, one run decides. Then
    the others by bisection as if the last passed, the last run only where the bisection ends on it: each run is a
    forward of the model over the choice text, and the last is seldom the one chosen. ``last_first``: the last
    tried first instead, where it failing (none passing) is the likely answer."""
    if not rungs:
        return None
    if last_first and not tried(rungs[-1]):
        return None
    if not last_first and tried(rungs[0]):
        return rungs[0]
    low, high = (0 if last_first else 1), len(rungs) - 1  # rungs[high] passes, or is the last, not yet run
    while low < high:
        middle = (low + high) // 2
        if tried(rungs[middle]):
            high = middle
        else:
            low = middle + 1
    return rungs[high] if tried(rungs[high]) else None


MIXED_ROLES = ("q_proj", "k_proj", "v_proj", "qkv_proj", "query_key_value", "attn.c_attn", "Wqkv",
               "down_proj", "mlp.c_proj", "mlp.fc2", "dense_4h_to_h")
"""the attention's input projections and the MLP's output projection, as the families' modules name them: the
layers llama.cpp's mixed strategy keeps at higher precision"""


def mixed_layers(blocks: list[list[str]]) -> list[str]:
    """The Linears of ``blocks`` (each block's layer paths, in order) that llama.cpp's mixed strategy, which ONNX
    Runtime GenAI's builder takes as ``mixed_layers``, finds most sensitive with no data to measure on: the attention's
    query/key/value and the MLP's down projection of the first and the last eighth of the blocks and of every third
    block between (its figures on the real SmolLM2: ``benchmarks/results/real_llm.md``)."""
    n = len(blocks)
    chosen = [i for i in range(n) if i < n / 8 or i >= 7 * n / 8 or (i - round(n / 8)) % 3 == 2]
    return [name for i in chosen for name in blocks[i] if name.endswith(MIXED_ROLES)]


def checked_cap(max_bits: float | None, int4_bits: float) -> None:
    """A cap below the INT4 grid's own bits is bad input."""
    if max_bits is not None and max_bits < int4_bits - 1e-9:
        raise UsageError(f"--max-bits-per-weight {max_bits:g} is below the INT4 grid's own {int4_bits:.3f} bits per "
                         "weight (4-bit codes, a float16 scale and a zero point per group)",
                         fix=f"pass at least {int4_bits:.2f}, or a larger --group-size")


def advice(choice: dict[str, Any]) -> str:
    """What to do after a failed verdict, as a flag, from ``LayerChoice.to_json``."""
    if not choice["held"] and choice["would_pass"]:
        return (f"the INT4 choice kept {choice['chosen']:.0%} of the weights in 8 bits, the most the size target "
                f"allows ({choice['model_bits']:g} bits per parameter), and that did not hold the budget on "
                f"{choice['text']}; --max-bits-per-weight {choice['would_pass']['model_bits']:g} held it there")
    if not choice["held"]:
        return (f"no share of the weights in 8 bits up to {choice['chosen']:.0%} held the budget on {choice['text']}: "
                "build --int8 (weight-only, every layer in 8 bits), or loosen --max-drift")
    step = (f"--max-bits-per-weight {choice['more']['model_bits']:g} keeps {choice['more']['share']:.0%} of the "
            "weights in 8 bits, or " if choice.get("more") else "")
    return (f"the INT4 choice held the budget on {choice['text']} with {choice['chosen']:.0%} of the weights in 8 "
            f"bits, and the --val text judged it otherwise: {step}build --int8; a --calib text like the --val text "
            "chooses closer to it")
