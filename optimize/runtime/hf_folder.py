"""A Hugging Face model folder (``config.json`` plus ``*.safetensors``) as a model source.

Needs the ``llm`` extra (transformers). The model class is the first of ``config.json``'s
``architectures`` that transformers has (``LlamaForCausalLM``, ``BertModel``, ...), else
``AutoModel``. Weights load from safetensors only, so nothing is unpickled, and nothing is
downloaded (``HF_HUB_OFFLINE``). The loaded model is wrapped so that it takes
``(input_ids, attention_mask)`` and returns one tensor: ``logits`` when the model has them
(causal and masked LMs, classifiers), else ``last_hidden_state``. The folder's tokenizer is the
default for ``--calib`` text files.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from infopt.core.errors import EnvironmentProblem, ModelLoadError
from infopt.core.inputspec import InputSpec

INPUTS = ("input_ids:int64[batch,seq]", "attention_mask:int64[batch,seq]")


def is_hf_folder(path: Path) -> bool:
    return path.is_dir() and (path / "config.json").is_file()


def has_tokenizer(path: Path) -> bool:
    return any((path / name).is_file() for name in ("tokenizer.json", "tokenizer.model", "vocab.txt", "vocab.json"))


def _wrapper_class():
    import torch
    from torch import nn

    class HFModel(nn.Module):
        """``(input_ids, attention_mask) -> logits or last_hidden_state`` around a transformers model."""

        def __init__(self, model: nn.Module, source_dir: str):
            super().__init__()
            self.model = model
            self.source_dir = source_dir
            has_head = hasattr(model, "get_output_embeddings") and model.get_output_embeddings() is not None
            classifier = "ForSequenceClassification" in type(model).__name__
            self.output_key = "logits" if has_head or classifier else "last_hidden_state"

        def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
            kwargs = {"use_cache": False} if getattr(self.model.config, "use_cache", None) is not None else {}
            out = self.model(input_ids=input_ids, attention_mask=attention_mask, return_dict=True, **kwargs)
            return out[self.output_key]

    return HFModel


def load_hf_folder(path: Path):
    """(wrapped module, InputSpec) for the folder at ``path``."""
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
    module = _wrapper_class()(model.eval(), str(path)).eval()
    return module, InputSpec.parse(list(INPUTS))
