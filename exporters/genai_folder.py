"""The ONNX Runtime GenAI folder: what ``onnxruntime_genai.Model`` loads and generates from, written by the
``write_genai_folder`` pass and copied to ``servers/onnxruntime-genai/`` of a text-generation build by its
emitter (``exporters/servers/onnxruntime_genai.py``).

It holds the decoder with its KV cache (``exporters/kv_decoder.py``) as ``model.onnx`` (external
data beside it when large), ``genai_config.json`` (the decoder's input and output names, the cache's
layout, the special tokens, greedy search by default) and the model folder's tokenizer files. The
build validates that very folder by generating from it.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from infopt.core import onnx_graph
from infopt.core.errors import UsageError
from infopt.exporters.families import genai_model_type
from infopt.exporters.kv_decoder import PAST, PRESENT, CacheLayout


@dataclass(frozen=True)
class GenaiFolder:
    """The folder :func:`write_folder` wrote and the build validated (``Artifact.products``), which the
    emitter copies into the output."""

    path: Path


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model",
                   "vocab.json", "merges.txt", "vocab.txt", "added_tokens.json", "chat_template.jinja")


def genai_config(config: Any, layout: CacheLayout, context_length: int, source: Path, *, threads: int,
                 share_buffer: bool, model_file: str = "model.onnx") -> dict:
    """``genai_config.json`` for the decoder exported from a transformers model with ``config``, whose
    folder ``source`` holds the tokenizer.

    ``threads``: the decoder session's intra-op threads (the target machine's cores; ONNX Runtime GenAI 0.18
    left to itself runs the decoder on fewer, measured at 1.6x the time per token on 2 cores).
    ``share_buffer``: the cache is one buffer of ``max_length`` positions that each step writes into
    (``past_present_share_buffer``), which needs every layer's attention to be ``GroupQueryAttention``;
    otherwise each step's present cache is a new, concatenated tensor."""
    heads = int(getattr(config, "num_attention_heads", layout.kv_heads))
    bos, eos, pad = special_tokens(config, layout.vocab, source)
    return {
        "model": {
            "type": genai_model_type(config),
            "vocab_size": layout.vocab,
            "context_length": context_length,
            "bos_token_id": bos,
            "eos_token_id": eos if len(eos) > 1 else eos[0],
            "pad_token_id": pad,
            "decoder": {
                "session_options": {"log_id": "infopt", "intra_op_num_threads": threads, "provider_options": []},
                "filename": model_file,
                "head_size": layout.head_size,
                "hidden_size": int(getattr(config, "hidden_size", heads * layout.head_size)),
                "num_attention_heads": heads,
                "num_key_value_heads": layout.kv_heads,
                "num_hidden_layers": layout.layers,
                "inputs": {"input_ids": "input_ids", "attention_mask": "attention_mask",
                           "past_key_names": PAST.format("%d", "key"), "past_value_names": PAST.format("%d", "value")},
                "outputs": {"logits": "logits", "present_key_names": PRESENT.format("%d", "key"),
                            "present_value_names": PRESENT.format("%d", "value")},
            },
        },
        # greedy by default, as the build validated it
        "search": {"do_sample": False, "num_beams": 1, "top_k": 1, "max_length": context_length, "min_length": 0,
                   "past_present_share_buffer": share_buffer, "num_return_sequences": 1, "repetition_penalty": 1.0,
                   "temperature": 1.0},
    }


def special_tokens(config: Any, vocab: int, source: Path) -> tuple[int, list[int], int]:
    """(bos, eos ids, pad) as ``genai_config.json`` declares them: the config's where the vocabulary holds them,
    the first end token in their place."""
    eos = end_tokens(config, vocab, source)
    pad = _in_vocab(getattr(config, "pad_token_id", None), vocab)
    bos = _in_vocab(getattr(config, "bos_token_id", None), vocab)
    return (int(bos) if bos is not None else eos[0], eos, int(pad) if pad is not None else eos[0])


def end_tokens(config: Any, vocab: int, source: Path) -> list[int]:
    """The end-of-sequence ids generation stops at: the config's and then those of the folder's
    ``generation_config.json`` that the vocabulary holds (a chat model's config may name one end token and its
    generation config the turn's end too, as Qwen2.5-Instruct's do), else the tokenizer's (a config may name an id
    past the vocabulary, which no step can generate)."""
    named = [*_listed(getattr(config, "eos_token_id", None)), *_listed(_generation_config(source).get("eos_token_id"))]
    ids = list(dict.fromkeys(i for i in named if _in_vocab(i, vocab) is not None))
    if not ids:
        from transformers import AutoTokenizer

        found = _in_vocab(AutoTokenizer.from_pretrained(str(source)).eos_token_id, vocab)
        if found is None:
            raise UsageError(f"the model names no end-of-sequence token within its vocabulary of {vocab} (config: {named})",
                             where=str(source / "config.json"),
                             fix="set eos_token_id in config.json (or the tokenizer's eos_token) to the id generation ends at")
        ids = [found]
    return [int(i) for i in ids]


def _listed(value: Any) -> list:
    return list(value) if isinstance(value, (list, tuple)) else [value]


def _generation_config(source: Path) -> dict:
    """The folder's ``generation_config.json`` (empty where it has none or it is not a JSON object)."""
    try:
        found = json.loads((source / "generation_config.json").read_text())
    except (OSError, ValueError):
        return {}
    return found if isinstance(found, dict) else {}


def _in_vocab(token: Any, vocab: int) -> int | None:
    return int(token) if isinstance(token, int) and 0 <= token < vocab else None


def write_folder(folder: Path, onnx_file: Path, config: dict, source: Path, *, move: bool = False) -> Path:
    """The GenAI folder: the model (with its external data; with ``move``, that file moved from beside
    ``onnx_file``), ``genai_config.json``, the source's tokenizer files."""
    folder.mkdir(parents=True, exist_ok=True)
    model_file = folder / config["model"]["decoder"]["filename"]
    onnx_graph.place_model(onnx_file, model_file, move=move)  # its tensors beside it, under the folder's model's name
    (folder / "genai_config.json").write_text(json.dumps(config, indent=2) + "\n")
    for name in TOKENIZER_FILES:
        if (source / name).is_file():
            shutil.copyfile(source / name, folder / name)
    return folder


def weights_bytes(folder: Path) -> int:
    """What the folder's model files hold (its weights, as stored: 4-bit, int8 or float)."""
    return sum(p.stat().st_size for p in folder.iterdir() if p.suffix in (".onnx", ".data"))


def has_tokenizer(source: Path) -> bool:
    return (source / "tokenizer.json").is_file() or (source / "tokenizer.model").is_file()
