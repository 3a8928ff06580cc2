"""The model's own text, to calibrate an LM given none: sequences it samples from its start token.

Where no ``--calib`` is given, what GPTQ needs is activations like those the model will serve. Text the model
writes itself has them (its topics, its token statistics, the loud channels they drive); uniformly random token ids
have only the structure the layers impose (what each cost the real SmolLM2: ``benchmarks/results/real_llm.md``).
Sampling is plain (temperature 1, no top-k or top-p, nothing from the checkpoint's generation config) and seeded:
the same model gives the same sequences, so the same bytes.
"""

from __future__ import annotations

import numpy as np

from infopt.core.bf16_compute import float32_blocks
from infopt.core.manifest import data_sha256
from infopt.quantize.calib_data import CalibrationSet
from infopt.quantize.int4_config import METHOD_CONFIGS
from infopt.validators.generation import first_token_id, generation_settings, tall_products

SAMPLED_MAX_PARAMETERS = 250_000_000
"""the most parameters ``--int4`` without ``--calib`` samples its own text and calibrates GPTQ on it for. On 2 cores
that cost 0.4-0.7 s a million parameters more than rounding by RTN (108 s against 53 s at SmolLM2's 135M; 1,039 s
against 140 s at Qwen2.5-1.5B's shape), and RTN alone lost several times more on the real SmolLM2
(``benchmarks/results/rules.md``); past this the build rounds by RTN, and ``--int4-method gptq`` samples anyway"""

SAMPLED = "tokens the model sampled"
"""the source of :func:`sampled_calibration`'s set, as the build's notes and manifest name it"""


def start_token(config) -> int:
    """The id a sequence starts from: the model's beginning-of-text token, else its end token (which precedes a new
    document in its training text), else 0."""
    return first_token_id(config, "bos_token_id", "eos_token_id")


def sampled_calibration(lm, passages: int, length: int, seed: int = 0) -> CalibrationSet:
    """``passages`` sequences of ``length`` tokens (the start token, then what ``lm`` samples), generated together, as
    one-sample batches with their attention masks. Each step's few rows multiply as ``weight @ x.T``
    (:func:`~infopt.validators.generation.tall_products`); where bf16 products are emulated, each layer multiplies
    in float32 (:func:`~infopt.core.bf16_compute.float32_blocks`)."""
    import torch
    from transformers import GenerationConfig

    start = start_token(lm.config)
    plain = GenerationConfig(do_sample=True, temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=length - 1,
                             min_new_tokens=length - 1, bos_token_id=start, pad_token_id=start,
                             eos_token_id=getattr(lm.config, "eos_token_id", None))
    ids = torch.full((passages, 1), start, dtype=torch.long, device=next(lm.parameters()).device)
    with (generation_settings(lm, plain), torch.random.fork_rng(devices=[]), torch.inference_mode(),
          tall_products(lm), float32_blocks(lm)):
        torch.manual_seed(seed)
        rows = lm.generate(ids, attention_mask=torch.ones_like(ids), generation_config=plain).cpu().numpy()
    batches = [{"input_ids": row[None].astype(np.int64), "attention_mask": np.ones((1, row.shape[0]), np.int64)}
               for row in rows]
    return CalibrationSet(batches, passages, f"{passages} sequences of {length} {SAMPLED} (no --calib)",
                          data_sha256(batches))


def samples_own_text(parameters: int, method: str) -> bool:
    """Whether an INT4 build given no ``--calib`` calibrates on the model's own samples: a method that needs data
    (``--int4-method gptq``) always; the default (``auto``) up to :data:`SAMPLED_MAX_PARAMETERS`, else it rounds by
    RTN."""
    if method == "auto":
        return parameters <= SAMPLED_MAX_PARAMETERS
    return METHOD_CONFIGS.named(method).needs_data
