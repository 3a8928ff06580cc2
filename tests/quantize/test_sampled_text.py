"""The model's own samples as calibration text: seeded (the same sequences each build, the caller's random state
untouched), from the start token, plain sampling whatever the checkpoint's generation config asks for, and a bf16
model given back in bf16."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from infopt.quantize.sampled_text import (
    SAMPLED,
    SAMPLED_MAX_PARAMETERS,
    sampled_calibration,
    samples_own_text,
    start_token,
)

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def llama():
    config = transformers.LlamaConfig(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                      bos_token_id=5, eos_token_id=6)
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config).eval()


def rows(calibration) -> np.ndarray:
    return np.concatenate([batch["input_ids"] for batch in calibration.batches])


def test_the_same_seed_samples_the_same_sequences_from_the_start_token(llama):
    state = torch.random.get_rng_state()
    first = sampled_calibration(llama, 4, 12)
    assert torch.equal(torch.random.get_rng_state(), state)  # the caller's random state is its own
    again, other = sampled_calibration(llama, 4, 12), sampled_calibration(llama, 4, 12, seed=1)
    ids = rows(first)
    assert ids.shape == (4, 12) and (ids[:, 0] == 5).all() and ids.dtype == np.int64
    assert first.digest == again.digest and np.array_equal(ids, rows(again))
    assert not np.array_equal(ids, rows(other))
    assert len(np.unique(ids[:, 1:])) > 8  # sampled, not one greedy path repeated
    assert all(b["attention_mask"].shape == (1, 12) and b["attention_mask"].all() for b in first.batches)
    assert first.source == f"4 sequences of 12 {SAMPLED} (no --calib)"


def test_the_checkpoints_generation_config_is_not_applied_and_is_given_back(llama):
    stored = transformers.GenerationConfig(do_sample=False, max_new_tokens=2, eos_token_id=6, bos_token_id=5)
    llama.generation_config = stored
    sampled = rows(sampled_calibration(llama, 4, 12))
    assert llama.generation_config is stored
    # greedy decoding from one start token gives one sequence; the rows differ, so they were sampled
    assert len({tuple(row) for row in sampled}) == 4 and sampled.shape[1] == 12


def test_a_bf16_model_samples_and_keeps_its_bf16_weights(llama):
    half = transformers.LlamaForCausalLM(llama.config).to(torch.bfloat16).eval()
    before = {n: p.detach().clone() for n, p in half.named_parameters()}
    assert rows(sampled_calibration(half, 2, 8)).shape == (2, 8)
    assert all(p.dtype == torch.bfloat16 and torch.equal(p, before[n]) for n, p in half.named_parameters())


def test_the_start_token_falls_back_to_the_end_token_then_zero():
    assert start_token(transformers.LlamaConfig(bos_token_id=None, eos_token_id=[7, 8])) == 7
    assert start_token(transformers.LlamaConfig(bos_token_id=None, eos_token_id=None)) == 0


def test_without_calibration_text_the_default_samples_up_to_its_size_and_a_method_that_needs_data_always():
    assert samples_own_text(SAMPLED_MAX_PARAMETERS, "auto") and not samples_own_text(SAMPLED_MAX_PARAMETERS + 1, "auto")
    assert all(samples_own_text(10**10, method) for method in ("gptq", "awq", "awq-gptq"))
    assert not samples_own_text(1000, "rtn")
