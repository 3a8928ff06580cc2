"""Checkpoints at the sizes users bring, written without building the model in memory.

:func:`write_checkpoint` writes a transformers model folder (``config.json``, bf16 ``*.safetensors`` shards and
their index) for a config, tensor by tensor: the tensors' names and shapes come from the model built on the
``meta`` device (no memory), and each tensor's bytes are streamed to its shard in chunks. With ``sparse`` the
bytes are left as holes in the files (zeros that take no disk and no time: a folder whose headers declare
an 8B model, for what is read from the headers alone); otherwise they are random normals times 0.02, as
transformers initializes them. Real models' configs are in :data:`CONFIGS`.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np

QWEN_COMMON = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_act": "silu",
               "max_position_embeddings": 32768, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "vocab_size": 151936,
               "torch_dtype": "bfloat16", "use_sliding_window": False, "bos_token_id": 151643, "eos_token_id": 151643}
LLAMA31_COMMON = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
                  "max_position_embeddings": 131072, "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "vocab_size": 128256,
                  "tie_word_embeddings": False, "torch_dtype": "bfloat16", "bos_token_id": 128000, "eos_token_id": 128001,
                  "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                   "original_max_position_embeddings": 8192, "rope_type": "llama3"}}
CONFIGS = {
    "qwen2.5-0.5b": {**QWEN_COMMON, "hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24,
                     "num_attention_heads": 14, "num_key_value_heads": 2, "tie_word_embeddings": True},
    "qwen2.5-1.5b": {**QWEN_COMMON, "hidden_size": 1536, "intermediate_size": 8960, "num_hidden_layers": 28,
                     "num_attention_heads": 12, "num_key_value_heads": 2, "tie_word_embeddings": True},
    "qwen2.5-3b": {**QWEN_COMMON, "hidden_size": 2048, "intermediate_size": 11008, "num_hidden_layers": 36,
                   "num_attention_heads": 16, "num_key_value_heads": 2, "tie_word_embeddings": True},
    "llama-3.1-8b": {**LLAMA31_COMMON, "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
                     "num_attention_heads": 32, "num_key_value_heads": 8},
    "llama-3.1-70b": {**LLAMA31_COMMON, "hidden_size": 8192, "intermediate_size": 28672, "num_hidden_layers": 80,
                      "num_attention_heads": 64, "num_key_value_heads": 8},
}
"""the real models' configs (as their config.json files declare them), for random weights of their shapes"""

CHUNK = 1 << 24
"""elements written at a time"""


def tensor_shapes(config: dict) -> dict[str, tuple[int, ...]]:
    """The checkpoint's tensors (name -> shape) as ``save_pretrained`` writes them: the model built on the meta
    device, a tied head left out."""
    import torch
    import transformers

    cfg = transformers.AutoConfig.for_model(**config)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(cfg)
    shapes = {name: tuple(p.shape) for name, p in model.state_dict().items()}
    if cfg.tie_word_embeddings:
        shapes.pop("lm_head.weight", None)
    return shapes


def _bf16(values: np.ndarray) -> bytes:
    """float32 values as bfloat16 bytes (rounded to nearest even)."""
    bits = values.astype(np.float32).view(np.uint32)
    bits = bits + 0x7FFF + ((bits >> 16) & 1)
    return (bits >> 16).astype(np.uint16).tobytes()


def write_checkpoint(config: dict, folder: Path, *, sparse: bool = False, shard_bytes: int = 2 * 10**9,
                     seed: int = 0) -> int:
    """Write ``config`` and bf16 weights for it into ``folder`` (see the module doc); returns the weights' bytes."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    shapes = tensor_shapes(config)
    shards: list[list[str]] = [[]]
    size = 0
    for name, shape in shapes.items():
        nbytes = 2 * int(np.prod(shape))
        if shards[-1] and size + nbytes > shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append(name)
        size += nbytes
    rng = np.random.default_rng(seed)
    index, total = {}, 0
    for number, names in enumerate(shards, 1):
        file = (f"model-{number:05d}-of-{len(shards):05d}.safetensors" if len(shards) > 1 else "model.safetensors")
        header, offset = {}, 0
        for name in names:
            nbytes = 2 * int(np.prod(shapes[name]))
            header[name] = {"dtype": "BF16", "shape": list(shapes[name]), "data_offsets": [offset, offset + nbytes]}
            offset += nbytes
            index[name] = file
        head = json.dumps(header, separators=(",", ":")).encode()
        head += b" " * (-len(head) % 8)
        with (folder / file).open("wb") as f:
            f.write(struct.pack("<Q", len(head)) + head)
            if sparse:
                f.truncate(8 + len(head) + offset)
            else:
                for name in names:
                    count = int(np.prod(shapes[name]))
                    ones = name.endswith("norm.weight")  # a norm's scale: ones, as transformers initializes it
                    for start in range(0, count, CHUNK):
                        n = min(CHUNK, count - start)
                        f.write(_bf16(np.ones(n, np.float32) if ones else rng.standard_normal(n, np.float32) * 0.02))
        total += offset
    if len(shards) > 1:
        (folder / "model.safetensors.index.json").write_text(json.dumps(
            {"metadata": {"total_size": total}, "weight_map": index}, indent=2))
    return total
