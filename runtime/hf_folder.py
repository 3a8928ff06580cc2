"""A Hugging Face model folder (``config.json`` plus ``*.safetensors``) as a model source.

Needs the ``llm`` extra (transformers). The model class is the first of ``config.json``'s
``architectures`` that transformers has (``LlamaForCausalLM``, ``BertModel``, ...), else
``AutoModel``. Weights load from safetensors only, so nothing is unpickled, and nothing is
downloaded (``HF_HUB_OFFLINE``). The model's task (:mod:`infopt.runtime.tasks`: causal LM,
classification, question answering, feature extraction, sentence embedding, image, audio) gives the
inputs it reads, the module that is exported (one tensor out per head output, named after it) and
how raw files become ``--val`` and ``--calib`` samples. The folder's tokenizer is the default for
text files. An encoder-decoder (BART, T5, Marian, Whisper) is refused with what to build instead.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from infopt.core.errors import EnvironmentProblem, ModelLoadError, UsageError
from infopt.core.inputspec import InputSpec
from infopt.core.logs import quiet_third_party
from infopt.core.memory import drop_file_pages, file_mappings
from infopt.runtime.memory_estimate import checkpoint_size
from infopt.runtime.tasks import TASKS, Task, task_for


@dataclass(frozen=True)
class HFSource:
    module: Any
    spec: InputSpec
    output_names: tuple[str, ...]
    default_name: str
    """the model's own name for the output folder: the config's ``_name_or_path`` when the folder's is generic"""
    task: Task


def is_hf_folder(path: Path) -> bool:
    return path.is_dir() and (path / "config.json").is_file()


GENERIC_NAMES = re.compile(r"^(model|models|checkpoint|final|output|hf|[0-9a-f]{40})$", re.IGNORECASE)


def _default_name(path: Path, config: dict) -> str:
    """The folder's name, or the config's ``_name_or_path`` (its last part) when the folder's says nothing."""
    own = config.get("_name_or_path") or ""
    if GENERIC_NAMES.match(path.name) and own:
        return Path(own.rstrip("/")).name
    return path.name


def _has_decoder(model) -> bool:
    """Whether the model runs a decoder (BART, T5, Whisper's seq2seq): transformers' ``get_decoder``
    answers the model itself for one that keeps only the encoder (WhisperForAudioClassification)."""
    try:
        decoder = model.get_decoder()
    except (AttributeError, NotImplementedError):
        return False
    return decoder is not None and decoder is not model


def _exportable_experts(transformers) -> dict:
    """Mixture-of-experts layers (Mixtral, Qwen-MoE...) as batched matmuls over every expert: transformers
    5 runs them by default through its own custom op (``transformers.grouped_mm_fallback``), which ONNX
    export cannot translate, and its ``eager`` form loops over the experts a batch routes to, which
    torch.export cannot capture (the loop depends on the data)."""
    return {"experts_implementation": "batched_mm"} if hasattr(transformers.PreTrainedModel, "get_correct_experts_implementation") else {}


def load_dtype(path: Path) -> str:
    """``bfloat16`` where most of the folder's safetensors bytes are bf16, else ``float32`` (fp16 weights are
    widened: a CPU computes in float16 slowly, and its range is narrower)."""
    size = checkpoint_size(path)
    return "bfloat16" if size is not None and size.dtype == "BF16" else "float32"


def widen(model) -> None:
    """Every floating parameter and buffer of ``model`` not in float32 widened to it in place, one at a time, each
    parameter's pages of the mapped checkpoint handed back once widened: the stored weights' pages and the float32
    copy are never all resident at once. Tied parameters stay tied (each Parameter keeps its identity)."""
    import torch

    mappings = file_mappings()
    for param in model.parameters():  # each once, a tied one too
        if param.is_floating_point() and param.dtype != torch.float32:
            stored = param.data
            param.data = stored.float()
            drop_file_pages(stored, mappings)
    for module in model.modules():
        for name, buffer in module._buffers.items():
            if buffer is not None and buffer.is_floating_point() and buffer.dtype != torch.float32:
                module._buffers[name] = buffer.float()


def load_hf_folder(path: Path, *, stored_dtype: bool = False) -> HFSource:
    """The wrapped module, its InputSpec, output name and default name for the folder at ``path``: in float32, or
    with ``stored_dtype`` in bfloat16 where the checkpoint stores its weights so (half the memory; a build that rounds
    the weights to INT4 layer by layer needs no float32 copy of them)."""
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
    stored = load_dtype(path)
    try:
        with quiet_third_party():  # transformers' "Loading weights" bar, from the Python API too
            # a bf16 checkpoint loads as stored (its tensors map the files, read only when used), and a float32
            # model is widened from it parameter by parameter: loaded as float32, the files' pages and the whole
            # float32 copy were resident at once (9.7 GB at Qwen2.5-1.5B's 3.1 GB checkpoint)
            model = cls.from_pretrained(str(path), use_safetensors=True, attn_implementation="eager", dtype=stored,
                                        **_exportable_experts(transformers))
            if not stored_dtype and stored != "float32":
                widen(model)
                model.config.dtype = next(model.parameters()).dtype  # as a float32 load says
    except Exception as exc:  # noqa: BLE001 - transformers raises many types for a bad folder
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ModelLoadError(f"transformers cannot load {path} as {cls.__name__}: {first}",
                             fix="check that config.json and the safetensors files belong together") from exc
    if config.get("is_encoder_decoder") and _has_decoder(model):
        raise UsageError(f"{path} is an encoder-decoder model ({cls.__name__}), which infopt does not build as one "
                         "graph: its decoder needs decoder inputs and a generation loop",
                         fix="build its encoder: save model.get_encoder() (e.g. T5EncoderModel) with save_pretrained "
                             "and build that folder; text encoders, decoder-only LMs, image and audio encoders build as they are")
    task = task_for(model, path, config)
    if task is None:
        raise UsageError(f"{path}'s model ({cls.__name__}) reads {getattr(model, 'main_input_name', '?')!r}, which no "
                         f"task infopt builds takes ({', '.join(t.name for t in TASKS)})",
                         fix="export the model to ONNX yourself and build the .onnx file")
    module = task.module(model.eval(), path).eval()
    return HFSource(module, task.spec(model, path, config), module.output_keys, _default_name(path, config), task)
