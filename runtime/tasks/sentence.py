"""The sentence-embedding task: a sentence-transformers folder (one with ``modules.json``:
Transformer, Pooling, and optionally Normalize) exported as the sentence encoder it is.

The pooling its ``Pooling`` config names (mean, CLS, max, mean-sqrt-len, concatenated in
sentence-transformers' order) and the L2 normalization are inside the graph, one output named
``sentence_embedding``; its sequence range defaults to 1..``max_seq_length``. Other modules (Dense,
...) are refused with what to do. Judged by cosine to what ``encode`` gives; raw data is text.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path

from infopt.core.errors import ModelLoadError
from infopt.runtime.tasks.base import Task
from infopt.runtime.tasks.text import TEXT_SUFFIXES, positions, read_with_folder_tokenizer, token_spec, token_types, wrapper_class

POOLING_MODES = ("cls", "max", "mean", "mean_sqrt_len_tokens")
"""the pooling modes this export computes"""
LEGACY_POOLING = {"pooling_mode_cls_token": "cls", "pooling_mode_max_tokens": "max", "pooling_mode_mean_tokens": "mean",
                  "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens"}
"""older Pooling configs' flags, in the order sentence-transformers concatenates them"""
ST_MODULES = "sentence_transformers.models."


@dataclass(frozen=True)
class SentenceHead:
    """What a sentence-transformers folder puts after its Transformer."""

    pooling: tuple[str, ...]
    normalize: bool
    max_seq_length: int | None


def sentence_embedding(tokens, attention_mask, head: SentenceHead):
    """sentence-transformers' Pooling (and Normalize) on the token embeddings, as its modules compute them."""
    import torch

    mask = attention_mask.unsqueeze(-1).to(tokens.dtype)
    parts = []
    for mode in head.pooling:
        if mode == "cls":
            parts.append(tokens[:, 0])
        elif mode == "max":
            parts.append(torch.where(mask > 0, tokens, torch.full_like(tokens, -1e9)).max(dim=1).values)
        else:
            summed, count = (tokens * mask).sum(1), mask.sum(1).clamp(min=1e-9)
            parts.append(summed / count if mode == "mean" else summed / count.sqrt())
    pooled = parts[0] if len(parts) == 1 else torch.cat(parts, dim=1)
    return torch.nn.functional.normalize(pooled, p=2, dim=1) if head.normalize else pooled


def sentence_head(path: Path) -> SentenceHead | None:
    """The Pooling and Normalize a sentence-transformers folder names in ``modules.json``; None for another folder."""
    listed = path / "modules.json"
    if not listed.is_file():
        return None
    try:
        modules = json.loads(listed.read_text())
        kinds = [(m["type"].removeprefix(ST_MODULES), m.get("path", "")) for m in modules]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ModelLoadError(f"{listed} is not a sentence-transformers module list: {exc}",
                             fix="restore the folder's modules.json") from exc
    if not kinds or kinds[0][0] != "Transformer":
        raise ModelLoadError(f"{listed} does not start with a Transformer module", fix="pass the folder of a text encoder")
    others = [k for k, _ in kinds[1:] if k not in ("Pooling", "Normalize")]
    if others:
        raise ModelLoadError(f"{path} is a sentence-transformers model with module(s) {', '.join(others)}, which infopt does not "
                             "export (it exports Transformer, Pooling and Normalize)",
                             fix="remove modules.json from a copy of the folder to export the Transformer alone (token embeddings out)")
    pooling_dir = next((p for k, p in kinds if k == "Pooling"), None)
    modes: tuple[str, ...] = ("mean",)
    if pooling_dir is not None:
        modes = _pooling_modes(path, json.loads((path / pooling_dir / "config.json").read_text())) or modes
    bert_config = path / "sentence_bert_config.json"
    max_len = json.loads(bert_config.read_text()).get("max_seq_length") if bert_config.is_file() else None
    return SentenceHead(modes, any(k == "Normalize" for k, _ in kinds), max_len)


def _pooling_modes(path: Path, config: dict) -> tuple[str, ...]:
    """The modes a Pooling config asks for: ``pooling_mode`` (a name or a list), or the older
    ``pooling_mode_*`` flags; a mode this export does not compute is refused."""
    given = config.get("pooling_mode")
    if given is not None:
        modes = (given,) if isinstance(given, str) else tuple(given)
    else:
        modes = tuple(mode for flag, mode in LEGACY_POOLING.items() if config.get(flag))
        modes += tuple(k.removeprefix("pooling_mode_") for k, v in config.items()
                       if k.startswith("pooling_mode_") and k not in LEGACY_POOLING and v)
    unknown = [m for m in modes if m not in POOLING_MODES]
    if unknown:
        raise ModelLoadError(f"{path}'s pooling mode {', '.join(unknown)} is not one infopt exports",
                             fix=f"infopt exports {', '.join(POOLING_MODES)} pooling")
    return modes


def _spec(model, path, config):
    head = sentence_head(path)
    return token_spec((head.max_seq_length if head else None) or positions(model, config), token_types(model) is not None)


def _module(model, path):
    pool = functools.partial(sentence_embedding, head=sentence_head(path))
    return wrapper_class()(model, str(path), ("sentence_embedding",), pool=pool)


SENTENCE_EMBEDDING = Task("sentence-embedding", "cosine", lambda m, p, c: (p / "modules.json").is_file(), _spec, _module,
                          TEXT_SUFFIXES, read_with_folder_tokenizer)
