"""A bf16 checkpoint loaded for a float32 build: widened from the weights as stored, equal to transformers' own
float32 load, tied weights still tied, and no page of the checkpoint lost or changed."""

from __future__ import annotations

import torch

from infopt.runtime.hf_folder import load_hf_folder
from tests.checkpoints import QWEN_COMMON, write_checkpoint

TINY = {**QWEN_COMMON, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "vocab_size": 512, "max_position_embeddings": 256, "bos_token_id": 0,
        "eos_token_id": 0, "tie_word_embeddings": True}


def test_a_bf16_checkpoint_widens_to_transformers_float32_load(tmp_path):
    import transformers

    write_checkpoint(TINY, tmp_path / "lm")
    lm = load_hf_folder(tmp_path / "lm").module.model
    expected = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "lm", dtype=torch.float32)
    assert {p.dtype for p in lm.parameters()} == {torch.float32} and lm.config.dtype == torch.float32
    assert lm.lm_head.weight is lm.model.embed_tokens.weight  # still tied
    theirs = expected.state_dict()
    assert all(torch.equal(value, theirs[name]) for name, value in lm.state_dict().items())
    again = load_hf_folder(tmp_path / "lm").module.model  # the file's pages handed back were read from it again
    assert all(torch.equal(value, theirs[name]) for name, value in again.state_dict().items())
