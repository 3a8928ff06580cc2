"""A GGUF of a Hugging Face decoder folder (Qwen2 or Llama) for llama.cpp's tools, without its tokenizer.

llama.cpp's ``convert_hf_to_gguf.py`` writes the tokenizer too, and refuses one whose pre-tokenizer it does not
know: the benches' small byte-level BPE (``tests/support/decoders.py``'s ``tokenizer_for``). ``llama-quantize``
and decoding from token ids need no tokenizer, so this writes ``tokenizer.ggml.model = "none"`` (llama.cpp's
``LLAMA_VOCAB_TYPE_NONE``: ``{arch}.vocab_size`` dummy tokens, no text in or out), the hyperparameters llama.cpp
reads for the architecture (those ``convert_hf_to_gguf.py`` writes from ``config.json``), and the tensors as
stored: 2-D BF16/F16/F32 as they are, 1-D ones (norms, Qwen2's q/k/v biases) in F32 as the converter writes them.
Names come from gguf's own ``TensorNameMap``; Llama's q/k rows are permuted for llama.cpp's rope as the
converter does, and Llama 3's rope scaling becomes its ``rope_freqs`` tensor. A tied head is no ``output.weight``:
llama.cpp reads ``token_embd`` for it.

Shard by shard, tensor by tensor (``safetensors.safe_open``): each is read, written, and dropped, so a 3 GB
checkpoint is never held twice. Writing uses the ``gguf`` package (the venv's, or llama.cpp's ``gguf-py``).

    python benchmarks/gguf_from_folder.py FOLDER OUT.gguf
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import numpy as np
from safetensors import safe_open

STORED = {"BF16": np.uint16, "F16": np.float16, "F32": np.float32}
"""safetensors dtypes read as they are (bf16 as its raw 16 bits: numpy has no bfloat16)"""
ARCHES = {"qwen2": "QWEN2", "llama": "LLAMA"}
"""``config.json``'s ``model_type`` -> gguf's ``MODEL_ARCH`` member"""


def shards(folder: Path) -> list[Path]:
    """The folder's safetensors files, in name order."""
    found = sorted(folder.glob("*.safetensors"))
    if not found:
        raise SystemExit(f"no *.safetensors in {folder}")
    return found


def entries(folder: Path) -> Iterator[tuple[str, str, tuple[int, ...], Path]]:
    """Every tensor of the folder's shards, from their headers alone (``safetensors.safe_open``): name, dtype,
    shape, shard."""
    for shard in shards(folder):
        with safe_open(shard, framework="pt") as f:
            for name in f.keys():
                piece = f.get_slice(name)
                yield name, piece.get_dtype(), tuple(piece.get_shape()), shard


def parameter_count(folder: Path) -> int:
    """The elements of every tensor in the folder's safetensors (a tied head counted once, as stored)."""
    return sum(math.prod(shape) for _, _, shape, _ in entries(folder))


def gguf_module():
    """The venv's ``gguf``, or llama.cpp's ``gguf-py`` (``LLAMA_CPP_DIR``) where the venv has none."""
    try:
        import gguf
    except ImportError:
        import os

        sys.path.insert(0, str(Path(os.environ["LLAMA_CPP_DIR"]) / "gguf-py"))
        import gguf
    return gguf


def permute(weights: np.ndarray, heads: int) -> np.ndarray:
    """Llama's q or k rows reordered for llama.cpp's rope (``convert_hf_to_gguf.py``'s ``LlamaModel.permute``)."""
    return (weights.reshape(heads, 2, weights.shape[0] // heads // 2, *weights.shape[1:])
            .swapaxes(1, 2).reshape(weights.shape))


def rope(config: dict) -> dict:
    """The rope's parameters, ``rope_theta`` among them, as transformers 5 writes them (``rope_parameters``) or 4
    did (``rope_theta`` and ``rope_scaling`` at the top)."""
    return {"rope_theta": config.get("rope_theta", 10000.0), **(config.get("rope_scaling") or {}),
            **(config.get("rope_parameters") or {})}


def llama3_rope_factors(config: dict) -> np.ndarray | None:
    """Llama 3's rope scaling as the per-frequency factors llama.cpp reads from ``rope_freqs.weight`` (the
    converter's ``generate_extra_tensors``); None without it."""
    scaling = rope(config)
    if scaling.get("rope_type", scaling.get("type", "")).lower() != "llama3":
        return None
    dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    freqs = 1.0 / (scaling["rope_theta"] ** (np.arange(0, dim, 2, dtype=np.float32) / dim))
    factor, low, high = scaling.get("factor", 8.0), scaling.get("low_freq_factor", 1.0), scaling.get("high_freq_factor", 4.0)
    old = scaling.get("original_max_position_embeddings", 8192)
    factors = []
    for wavelen in 2 * math.pi / freqs:
        if wavelen < old / high:
            factors.append(1.0)
        elif wavelen > old / low:
            factors.append(factor)
        else:
            smooth = (old / wavelen - low) / (high - low)
            factors.append(1 / ((1 - smooth) / factor + smooth))
    return np.asarray(factors, dtype=np.float32)


def add_hparams(writer, gguf, config: dict, ftype: int) -> None:
    """What llama.cpp reads for a Qwen2 or Llama model, from ``config.json``, and the vocabulary-less tokenizer."""
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(config["num_attention_heads"])
    writer.add_head_count_kv(config.get("num_key_value_heads", config["num_attention_heads"]))
    if rope(config).get("rope_type", "default") not in ("default", "llama3"):
        raise SystemExit(f"rope type {rope(config)['rope_type']!r}: only the default and Llama 3's")
    writer.add_rope_freq_base(rope(config)["rope_theta"])
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    if head_dim := config.get("head_dim"):
        writer.add_key_length(head_dim)
        writer.add_value_length(head_dim)
        writer.add_rope_dimension_count(head_dim)
    writer.add_vocab_size(config["vocab_size"])
    writer.add_file_type(ftype)
    writer.add_tokenizer_model("none")


def planned(folder: Path, config: dict, gguf) -> list[tuple[str, str, tuple[int, ...], Path, str]]:
    """The tensors to write: (GGUF name, dtype, shape, shard, HF name); a tied ``lm_head`` and rotary
    buffers left out, a name gguf does not map an error."""
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH[ARCHES[config["model_type"]]], config["num_hidden_layers"])
    out = []
    for name, dtype, shape, shard in entries(folder):
        if name.endswith("rotary_emb.inv_freq") or (name == "lm_head.weight" and config.get("tie_word_embeddings")):
            continue
        if dtype not in STORED:
            raise SystemExit(f"{name}: dtype {dtype} is not one of {', '.join(STORED)}")
        mapped = names.get_name(name, try_suffixes=(".weight", ".bias"))
        if mapped is None:
            raise SystemExit(f"{name}: no GGUF name for it in gguf's tensor map of {config['model_type']}")
        out.append((mapped, dtype, shape, shard, name))
    return out


def read(config: dict, hf_name: str, dtype: str, shard) -> np.ndarray:
    """One tensor as written from its open shard (``safe_open``): its stored values (bf16 as their raw 16 bits), 1-D
    ones as F32, Llama's q/k permuted."""
    import torch

    tensor = shard.get_tensor(hf_name)
    data = tensor.view(torch.int16).numpy().view(np.uint16) if dtype == "BF16" else tensor.numpy()
    if data.ndim == 1:
        return (data.astype(np.uint32) << 16).view(np.float32) if dtype == "BF16" else data.astype(np.float32)
    if config["model_type"] == "llama" and hf_name.endswith(("q_proj.weight", "k_proj.weight")):
        heads = config["num_attention_heads"]
        if hf_name.endswith("k_proj.weight"):
            heads = config.get("num_key_value_heads", heads)
        return permute(data, heads)
    return data


def convert(folder: Path, out: Path) -> int:
    """Write ``out`` from ``folder`` (see the module doc); returns its bytes."""
    gguf = gguf_module()
    config = json.loads((folder / "config.json").read_text())
    if config.get("model_type") not in ARCHES:
        raise SystemExit(f"model_type {config.get('model_type')!r}: only {', '.join(ARCHES)}")
    tensors = planned(folder, config, gguf)
    raw = {kind: gguf.GGMLQuantizationType[kind] for kind in STORED}
    kinds = {dtype for _, dtype, shape, *_ in tensors if len(shape) > 1}
    ftype = (gguf.LlamaFileType.MOSTLY_BF16 if "BF16" in kinds else gguf.LlamaFileType.MOSTLY_F16 if "F16" in kinds
             else gguf.LlamaFileType.ALL_F32)
    writer = gguf.GGUFWriter(out, gguf.MODEL_ARCH_NAMES[gguf.MODEL_ARCH[ARCHES[config["model_type"]]]])
    add_hparams(writer, gguf, config, ftype)
    for name, dtype, shape, *_ in tensors:
        kind = dtype if len(shape) > 1 else "F32"
        writer.add_tensor_info(name, shape, np.dtype(STORED[kind]), math.prod(shape) * np.dtype(STORED[kind]).itemsize,
                               raw_dtype=raw[kind])
    factors = llama3_rope_factors(config)
    if factors is not None:
        writer.add_tensor_info(gguf.TENSOR_NAMES[gguf.MODEL_TENSOR.ROPE_FREQS] + ".weight", factors.shape,
                               factors.dtype, factors.nbytes)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    with ExitStack() as stack:  # each shard opened once, its tensors read one at a time
        opened = {shard: stack.enter_context(safe_open(shard, framework="pt")) for shard in shards(folder)}
        for _, dtype, _, shard, hf_name in tensors:
            data = read(config, hf_name, dtype, opened[shard])
            writer.write_tensor_data(data)
            del data
    if factors is not None:
        writer.write_tensor_data(factors)
    writer.close()
    return out.stat().st_size


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit(__doc__.rsplit("\n\n", 1)[-1])
    print(f"{convert(Path(sys.argv[1]), Path(sys.argv[2])) / 1e6:.1f} MB")
