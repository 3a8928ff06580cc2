"""A Hugging Face model folder (``config.json`` plus ``*.safetensors``) as a model source.

Needs the ``llm`` extra (transformers). The model class is the first of ``config.json``'s
``architectures`` that transformers has (``LlamaForCausalLM``, ``BertModel``, ...), else
``AutoModel``. Weights load from safetensors only, so nothing is unpickled, and nothing is
downloaded (``HF_HUB_OFFLINE``). The loaded model is wrapped so that it takes
``(input_ids, attention_mask)`` and returns one tensor: ``logits`` when the model has them
(causal and masked LMs, classifiers), else ``last_hidden_state``. The folder's tokenizer is the
default for ``--calib`` text files.

A sentence-transformers folder (one with ``modules.json``: Transformer, Pooling, and optionally
Normalize) is exported as the sentence encoder it is: the pooling its ``Pooling`` config names
(mean, CLS, max, mean-sqrt-len, concatenated in sentence-transformers' order) and the L2
normalization inside the graph, one output named ``sentence_embedding``; its sequence range
defaults to 1..``max_seq_length``. Other modules (Dense, ...) are refused with what to do.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from infopt.core.errors import EnvironmentProblem, ModelLoadError, UsageError
from infopt.core.inputspec import DimRange, InputSpec
from infopt.runtime.hf_media import media_input, media_spec, media_wrapper_class

INPUTS = ("input_ids:int64[batch,seq]", "attention_mask:int64[batch,seq]")
SEQ_OPT = 128
"""the sequence length latency is measured at, unless the model's range is shorter"""
SEQ_MAX_DEFAULT = 2048
"""the longest default sequence: a model with more positions is built for this many unless --dim seq= says more"""
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


@dataclass(frozen=True)
class HFSource:
    module: Any
    spec: InputSpec
    output_name: str
    default_name: str
    """the model's own name for the output folder: the config's ``_name_or_path`` when the folder's is generic"""


def is_hf_folder(path: Path) -> bool:
    return path.is_dir() and (path / "config.json").is_file()


def has_tokenizer(path: Path) -> bool:
    return any((path / name).is_file() for name in ("tokenizer.json", "tokenizer.model", "vocab.txt", "vocab.json"))


def _wrapper_class():
    import torch
    from torch import nn

    class HFModel(nn.Module):
        """``(input_ids, attention_mask) -> logits or last_hidden_state`` around a transformers model,
        or the pooled (and normalized) sentence embedding when ``head`` says how."""

        def __init__(self, model: nn.Module, source_dir: str, head: SentenceHead | None = None):
            super().__init__()
            self.model = model
            self.source_dir = source_dir
            self.head = head
            # a model with a task head (transformers names them *For<Task>: CausalLM, MaskedLM,
            # SequenceClassification, TokenClassification...) answers logits; a bare encoder its tokens
            has_head = hasattr(model, "get_output_embeddings") and model.get_output_embeddings() is not None
            task_head = "For" in type(model).__name__
            self.output_key = "logits" if (has_head or task_head) and head is None else "last_hidden_state"

        def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
            kwargs = {"use_cache": False} if getattr(self.model.config, "use_cache", None) is not None else {}
            out = self.model(input_ids=input_ids, attention_mask=attention_mask, return_dict=True, **kwargs)
            if self.head is None:
                return out[self.output_key]
            return _sentence_embedding(out["last_hidden_state"], attention_mask, self.head)

    return HFModel


def _sentence_embedding(tokens, attention_mask, head: SentenceHead):
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


GENERIC_NAMES = re.compile(r"^(model|models|checkpoint|final|output|hf|[0-9a-f]{40})$", re.IGNORECASE)


def _default_name(path: Path, config: dict) -> str:
    """The folder's name, or the config's ``_name_or_path`` (its last part) when the folder's says nothing."""
    own = config.get("_name_or_path") or ""
    if GENERIC_NAMES.match(path.name) and own:
        return Path(own.rstrip("/")).name
    return path.name


def _spec(config: dict, head: SentenceHead | None) -> InputSpec:
    """Token inputs with the sequence range the model takes: up to its max_seq_length (a sentence
    encoder) or max_position_embeddings."""
    longest = (head.max_seq_length if head else None) or config.get("max_position_embeddings")
    spec = InputSpec.parse(list(INPUTS))
    if isinstance(longest, int) and longest > 1:
        longest = min(longest, SEQ_MAX_DEFAULT)
        spec = spec.with_dims({"seq": DimRange(1, min(SEQ_OPT, longest), longest)})
    return spec


def _has_decoder(model) -> bool:
    """Whether the model runs a decoder (BART, T5, Whisper's seq2seq): transformers' ``get_decoder``
    answers the model itself for one that keeps only the encoder (WhisperForAudioClassification)."""
    try:
        decoder = model.get_decoder()
    except (AttributeError, NotImplementedError):
        return False
    return decoder is not None and decoder is not model


def load_hf_folder(path: Path) -> HFSource:
    """The wrapped module, its InputSpec, output name and default name for the folder at ``path``."""
    config_file = path / "config.json"
    try:
        config = json.loads(config_file.read_text())
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"{config_file} is not valid JSON: {exc}", fix="restore the folder's config.json") from exc
    if not list(path.glob("*.safetensors")):
        found = sorted(p.name for p in path.iterdir() if p.suffix in (".bin", ".pt", ".pth", ".ckpt"))
        raise ModelLoadError(f"{path} has a config.json but no .safetensors weights"
                             + (f" (it has {', '.join(found)}, which would need unpickling)" if found else ""),
                             fix="save the model with save_pretrained(..., safe_serialization=True)")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        import transformers
    except ImportError as exc:
        raise EnvironmentProblem("Hugging Face model folders need transformers",
                                 fix="pip install 'infopt[llm]'") from exc
    names = [a for a in config.get("architectures") or [] if hasattr(transformers, a)]
    cls = getattr(transformers, names[0]) if names else transformers.AutoModel
    try:
        model = cls.from_pretrained(str(path), use_safetensors=True, attn_implementation="eager", dtype="float32")
    except Exception as exc:  # noqa: BLE001 - transformers raises many types for a bad folder
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ModelLoadError(f"transformers cannot load {path} as {cls.__name__}: {first}",
                             fix="check that config.json and the safetensors files belong together") from exc
    if config.get("is_encoder_decoder") and _has_decoder(model):
        raise UsageError(f"{path} is an encoder-decoder model ({cls.__name__}), which infopt does not build as one "
                         "graph: its decoder needs decoder inputs and a generation loop",
                         fix="build its encoder: save model.get_encoder() (e.g. T5EncoderModel) with save_pretrained "
                             "and build that folder; text encoders, decoder-only LMs, image and audio encoders build as they are")
    medium = media_input(model)
    if medium is not None:
        module = media_wrapper_class()(model.eval(), str(path), medium).eval()
        return HFSource(module, media_spec(medium, config), module.output_key, _default_name(path, config))
    head = sentence_head(path)
    module = _wrapper_class()(model.eval(), str(path), head).eval()
    output = "sentence_embedding" if head else module.output_key
    return HFSource(module, _spec(config, head), output, _default_name(path, config))
