"""The text-generation reference's greedy decode (``validators/generation.generate_eager``): the argmax whatever the
checkpoint's generation config asks for, and its float32 products with the weight on the left."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

from infopt.validators.generation import generate_eager, tall_products  # noqa: E402


def tiny_lm():
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                      bos_token_id=0, eos_token_id=1)
    return transformers.LlamaForCausalLM(config).eval()


def test_the_checkpoints_sampling_and_repetition_penalty_do_not_change_the_argmax():
    lm = tiny_lm()
    prompts = [[2, 3, 4, 5, 6, 7], [9, 8, 7, 6, 5, 4]]
    argmax = generate_eager(lm, prompts, 12)
    stored = transformers.GenerationConfig(do_sample=True, temperature=0.7, top_k=20, repetition_penalty=1.3,
                                           no_repeat_ngram_size=2, bos_token_id=0, eos_token_id=1)
    lm.generation_config = stored
    with torch.inference_mode():  # what generate(do_sample=False) makes of those settings: other tokens
        as_configured = [lm.generate(torch.tensor([p]), do_sample=False, max_new_tokens=12,
                                     min_new_tokens=12)[0, 6:].tolist() for p in prompts]
    assert as_configured != argmax
    assert generate_eager(lm, prompts, 12) == argmax and lm.generation_config is stored
    # an end token the model picks is held off until the last new token, as on the folder
    picked = max(set(argmax[0]), key=argmax[0].count)
    held_off = generate_eager(lm, prompts, 12, end_tokens=[1, picked])
    assert held_off != argmax and not any(picked in tokens for tokens in held_off)


@pytest.mark.parametrize("shape", [(1, 24), (4, 24), (2, 3, 24), (16, 24), (17, 24), (4, 1, 24)])
@pytest.mark.parametrize("bias", [True, False])
def test_tall_products_compute_what_linear_does_and_leave_the_layers_as_they_were(shape, bias):
    torch.manual_seed(1)
    model = torch.nn.Sequential(torch.nn.Linear(24, 40, bias=bias), torch.nn.ReLU(), torch.nn.Linear(40, 24, bias=bias))
    x = torch.randn(*shape)
    want = model(x)
    calls = []
    with tall_products(model):
        assert all("forward" in vars(m) for m in model if isinstance(m, torch.nn.Linear))
        hook = model[0].register_forward_hook(lambda *_: calls.append(1))  # hooks run as before
        got = model(x)
        hook.remove()
        half = model.to(torch.bfloat16)(x.to(torch.bfloat16))  # another dtype: F.linear as before
    model.float()
    assert got.shape == want.shape and calls == [1]
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    assert half.dtype == torch.bfloat16
    assert all("forward" not in vars(m) for m in model.modules())


@pytest.mark.parametrize("family", ["llama", "gpt2", "qwen2", "mistral", "phi3", "gemma", "qwen3", "gptneox", "opt"])
def test_the_prefills_figures_are_what_teacher_forcing_the_prompts_gives(family):
    """The figures a float32 build past 100M parameters reports come from the greedy check's own prefill: for every
    decoder family, the same top-1 tokens and log-likelihoods as the prompts run whole, and the same tokens."""
    import numpy as np

    from infopt.validators.generation import eager_figures, greedy_eager_figures
    from tests.support.decoders import with_layers

    lm = with_layers(family, 2)
    prompts = [[5, 9, 13, 17, 21, 25, 29, 33], [40, 41, 42, 43, 44, 45, 46, 47], [7, 7, 8, 8, 9, 9]]
    tokens, top1, nlls = greedy_eager_figures(lm, prompts, 6)
    assert tokens == generate_eager(lm, prompts, 6)
    want_top1, want_nlls = eager_figures(lm, prompts)
    assert [t.tolist() for t in top1] == [t.tolist() for t in want_top1]
    for got, want in zip(nlls, want_nlls):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    assert [len(n) for n in nlls] == [len(p) - 1 for p in prompts]
