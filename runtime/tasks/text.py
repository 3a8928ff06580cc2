"""Text tasks: token ids in (``input_ids``, ``attention_mask``, and ``token_type_ids`` where the model
has a token-type table of two or more rows: BERT, ELECTRA, DeBERTa-v2, ALBERT...), one tensor out.

- ``causal-lm``: a ``*ForCausalLM`` (or GPT-2's ``*LMHeadModel``), next-token ``logits`` over the whole sequence;
- ``question-answering``: a ``*ForQuestionAnswering``, ``start_logits`` and ``end_logits``;
- ``classification``: any other task head (sequence and token classification, masked LM...), ``logits``;
- ``feature-extraction``: a bare encoder, ``last_hidden_state``.

Raw data for ``--val`` and ``--calib`` is a ``.txt`` file of one example per line, through the
folder's tokenizer (or ``--tokenizer``), cut to the sequence range's ``opt`` length.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from infopt.core.errors import EnvironmentProblem, UsageError, first_line
from infopt.core.inputspec import DimRange, InputSpec
from infopt.runtime.tasks.base import Samples, Task, has_head

INPUTS = ("input_ids:int64[batch,seq]", "attention_mask:int64[batch,seq]")
TOKEN_TYPES = "token_type_ids:int64[batch,seq]"
SEQ_OPT = 128
"""the sequence length latency is measured at, unless the model's range is shorter"""
SEQ_MAX_DEFAULT = 2048
"""the longest default sequence: a model with more positions is built for this many unless --dim seq= says more"""
TEXT_SUFFIXES = (".txt",)


def token_spec(longest: Any, with_token_types: bool = False) -> InputSpec:
    """Token inputs with the sequence range the model takes: up to ``longest`` positions (capped at
    :data:`SEQ_MAX_DEFAULT`); ``with_token_types`` adds ``token_type_ids``."""
    spec = InputSpec.parse([*INPUTS, TOKEN_TYPES] if with_token_types else list(INPUTS))
    if isinstance(longest, int) and longest > 1:
        longest = min(longest, SEQ_MAX_DEFAULT)
        spec = spec.with_dims({"seq": DimRange(1, min(SEQ_OPT, longest), longest)})
    return spec


def wrapper_class():
    import torch
    from torch import nn

    class HFModel(nn.Module):
        """``(input_ids, attention_mask) ->`` the head's output(s) (``output_keys``) around a transformers model;
        ``pool`` (a function of the last hidden state and the mask) makes it a sentence encoder."""

        def __init__(self, model: nn.Module, source_dir: str, output_keys: tuple[str, ...], pool=None):
            super().__init__()
            self.model = model
            self.source_dir = source_dir
            self.output_keys = output_keys
            self.output_key = output_keys[0]
            self.pool = pool
            embeddings = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
            self.id_high = {name: high for name, high in (("input_ids", getattr(embeddings, "num_embeddings", None)),
                                                           ("token_type_ids", token_types(model))) if high}
            """random ids span the word-embedding and token-type tables (see ``core.sample_inputs.id_high``)"""

        def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                    token_type_ids: torch.Tensor | None = None):
            kwargs = {"use_cache": False} if getattr(self.model.config, "use_cache", None) is not None else {}
            if token_type_ids is not None:
                kwargs["token_type_ids"] = token_type_ids
            out = self.model(input_ids=input_ids, attention_mask=attention_mask, return_dict=True, **kwargs)
            if self.pool is not None:
                return self.pool(out["last_hidden_state"], attention_mask)
            if len(self.output_keys) == 1:
                return out[self.output_key]
            return tuple(out[key] for key in self.output_keys)

    return HFModel


def read_text(files: list[Path], spec: InputSpec, tokenizer: str | Path | None) -> Samples:
    """One sample per non-empty line, tokenized to the spec's sequence ``opt`` length; lines that are
    only special tokens are skipped, and a file that gives none is an error."""
    if tokenizer is None:
        raise UsageError(f"text {files[0]} needs the model's tokenizer",
                         fix="pass --tokenizer PATH_OR_NAME (a Hugging Face tokenizer folder)")
    try:
        from transformers import AutoTokenizer
    except ImportError as exc:
        raise EnvironmentProblem("text samples need transformers", fix="pip install 'infopt[llm]'") from exc
    try:
        tok = AutoTokenizer.from_pretrained(str(tokenizer))
    except (OSError, ValueError) as exc:
        raise UsageError(f"cannot load tokenizer {str(tokenizer)!r}: {first_line(exc)}",
                         fix="pass a local Hugging Face tokenizer folder (nothing is downloaded)") from exc
    seq = next((d for t in spec.inputs for d in t.shape[1:] if isinstance(d, str)), None)
    length = spec.dims[seq].opt if seq else None
    special = set(getattr(tok, "all_special_ids", []) or [])
    for path in files:
        lines = path.read_text(encoding="utf-8").splitlines()
        found = 0
        for i, line in enumerate(lines):
            if not line.strip():
                continue
            encoded = tok(line, truncation=length is not None, max_length=length, return_tensors="np")
            if not any(int(t) not in special for t in encoded["input_ids"].reshape(-1)):
                continue
            found += 1
            ids = encoded["input_ids"]
            # a tokenizer that gives no token types reads every line as one segment: type 0
            yield f"{path} line {i + 1}", {name: (encoded[name] if name in encoded else np.zeros_like(ids)).astype(np.int64)
                                           for name in spec.names if name in encoded or name == "token_type_ids"}
        if not found:
            raise UsageError(f"text {path} tokenizes to nothing: none of its {len(lines)} lines gives a "
                             f"token beyond the tokenizer's special tokens", where=str(path),
                             fix="give a text file with one real example per line (a few hundred lines is typical)")


def _reads_tokens(model, path, config) -> bool:
    return getattr(model, "main_input_name", "input_ids") == "input_ids"


def token_types(model) -> int | None:
    """Rows of the model's token-type table where it has two or more and its forward takes
    ``token_type_ids`` (BERT's segments A and B); None where token types cannot change its output
    (RoBERTa's one-row table, or none)."""
    import inspect

    rows = getattr(model.config, "type_vocab_size", None)
    try:
        takes = "token_type_ids" in inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        takes = False
    return rows if takes and isinstance(rows, int) and rows >= 2 else None


def _is_causal(model) -> bool:
    return type(model).__name__.endswith(("ForCausalLM", "LMHeadModel"))


def positions(model, config) -> int | None:
    """How many positions the model can take: ``max_position_embeddings``, less the offset of a model
    that numbers positions after its padding id (RoBERTa, XLM-R, CamemBERT, MPNet: a position table
    with a ``padding_idx`` starts counting at ``padding_idx + 1``, so 514 positions hold 512 tokens)."""
    longest = config.get("max_position_embeddings")
    if not isinstance(longest, int):
        return None
    for name, module in model.named_modules():
        if name.endswith("position_embeddings") and getattr(module, "padding_idx", None) is not None:
            return longest - (module.padding_idx + 1)
    return longest


def _spec(model, path, config) -> InputSpec:
    return token_spec(positions(model, config), token_types(model) is not None)


def has_tokenizer(path: Path) -> bool:
    return any((path / name).is_file() for name in ("tokenizer.json", "tokenizer.model", "vocab.txt", "vocab.json"))


def read_with_folder_tokenizer(files, spec, folder) -> Samples:
    """Text through the folder's own tokenizer."""
    return read_text(files, spec, folder if has_tokenizer(folder) else None)


def _text_task(name: str, judged_by: str, matches, outputs: tuple[str, ...]) -> Task:
    return Task(name, judged_by, matches, _spec, lambda model, path: wrapper_class()(model, str(path), outputs),
                TEXT_SUFFIXES, read_with_folder_tokenizer)


CAUSAL_LM = _text_task("causal-lm", "top-1 next token", lambda m, p, c: _reads_tokens(m, p, c) and _is_causal(m),
                       ("logits",))
QUESTION_ANSWERING = _text_task("question-answering", "cosine", lambda m, p, c: _reads_tokens(m, p, c)
                                and type(m).__name__.endswith("ForQuestionAnswering"), ("start_logits", "end_logits"))
CLASSIFICATION = _text_task("classification", "top-1", lambda m, p, c: _reads_tokens(m, p, c) and (
    has_head(m) or getattr(m, "get_output_embeddings", lambda: None)() is not None), ("logits",))
FEATURE_EXTRACTION = _text_task("feature-extraction", "cosine", _reads_tokens, ("last_hidden_state",))
