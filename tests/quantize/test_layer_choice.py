"""INT4's choice of 8-bit layers by accuracy: as many of the most sensitive layers as a size target holds, or without
one the smallest share of the weights whose teacher-forced figures on held-out text hold the budget, and what a
failed choice says to do next (a flag)."""

from __future__ import annotations

import numpy as np
import pytest

from infopt.core.errors import UsageError
from infopt.quantize.layer_choice import (
    CHOICE_SHARES,
    INT8_BITS,
    POOL_SHARE,
    ChoiceText,
    LayerChoice,
    advice,
    checked_cap,
    mixed_layers,
    stored_bits,
)

transformers = pytest.importorskip("transformers")


def tiny_llama():
    import torch

    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    return transformers.LlamaForCausalLM(config).eval()


def windows(count: int, seed: int) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(1, 256, 48).tolist() for _ in range(count)]


def gptq(lm, text: ChoiceText, max_bits=None):
    import torch

    from infopt.quantize.int4_config import GPTQConfig
    from infopt.quantize.weight_only import quantize_int4

    int4_bits = stored_bits(4, 32)
    chooser = LayerChoice(text, int4_bits, max_bits)
    batches = [(torch.tensor(windows(4, 1)),)]
    result = quantize_int4(lm, GPTQConfig(group_size=32), batches, int8_share=POOL_SHARE, choose=chooser)
    return chooser, result


def test_stored_bits_count_codes_scales_and_zero_points():
    # float16 scales, as half_scales stores them; 4-bit zero points on the asymmetric grid
    assert stored_bits(4, 128) == pytest.approx(4 + 20 / 128) and stored_bits(4, 32, symmetric=True) == 4.5
    assert INT8_BITS == pytest.approx(8.5)  # llama.cpp Q8_0's
    with pytest.raises(UsageError, match="below the INT4 grid's own"):
        checked_cap(4.1, stored_bits(4, 128))
    checked_cap(None, 5.0)
    checked_cap(5.0, 5.0)


def test_a_loose_budget_keeps_every_layer_in_int4_and_a_strict_one_the_most_the_pool_holds():
    """The real rounded model judged on real windows: a budget INT4 holds keeps nothing for 8 bits; one that no
    share holds (top-1 agreement 1.0 on a random model, whose flat logits INT4 reorders) ends at the pool's most,
    says none held, and that nothing above it was tried."""
    lm = tiny_llama()
    loose = ChoiceText.from_model(lm, windows(6, 2), None, 100.0, "random windows")
    chooser, result = gptq(lm, loose)
    assert chooser.chosen["share"] == 0.0 and chooser.chosen["passed"] and not result.for_8bit
    assert [r["share"] for r in chooser.rungs][0] == 0.0 and all(r["passed"] for r in chooser.rungs)
    assert type(lm.model.layers[0].mlp.down_proj).__name__ == "Int4Linear"

    lm = tiny_llama()
    strict = ChoiceText.from_model(lm, windows(6, 2), 1.0, None, "random windows")
    chooser, result = gptq(lm, strict)
    found = chooser.to_json()
    assert not found["held"] and found["would_pass"] is None and found["chosen"] <= POOL_SHARE
    assert all(not r["passed"] for r in found["rungs"]) and found["rungs"][0]["share"] == 0.0
    assert found["rungs"][-1]["share"] == found["chosen"] and len(found["rungs"]) <= 5  # none, a bisection, the most
    kept = sum(lm.get_submodule(n).weight.numel() for n in result.for_8bit)
    total = kept + sum(w.out_features * w.in_features for w in result.weights.values())
    assert result.for_8bit and abs(kept / total - found["chosen"]) < 1e-3
    assert all(type(lm.get_submodule(n)).__name__ == "Linear" for n in result.for_8bit)
    assert "build --int8" in advice(found)


def test_a_cap_limits_the_share_kept_for_8_bits():
    lm = tiny_llama()
    strict = ChoiceText.from_model(lm, windows(6, 2), 1.0, None, "random windows")
    cap = stored_bits(4, 32) + 0.3 * (INT8_BITS - stored_bits(4, 32))  # 30 % of the weights in 8 bits at most
    chooser, result = gptq(lm, strict, max_bits=cap)
    assert chooser.cap_share() == pytest.approx(0.3)
    assert 0 < chooser.chosen["share"] <= 0.3 + 1e-9 and chooser.chosen["bits"] <= cap + 1e-3
    assert not chooser.chosen["passed"] and chooser.would_pass is None  # nothing up to the pool's most held either
    above = [r["share"] for r in chooser.rungs if r["share"] > 0.3 + 1e-9]
    assert above == [chooser.rungs[-1]["share"]]  # above the cap, the pool's most alone: it failing, none holds


class Ladder(ChoiceText):
    """Figures that fall as more of the model is float: a known ladder, to check the search alone."""

    def __init__(self, ppl_at):
        super().__init__([], [], [], None, 0.1, "a ladder")
        self.ppl_at, self.use = ppl_at, None
        self.evaluated: list[float] = []

    def figures(self, lm):
        share = self.current
        self.evaluated.append(share)
        return {"top1": 1.0, "ppl_delta": self.ppl_at(share), "ppl_delta_interval": [0, 0]}


def search(ppl_at, max_bits=None):
    text = Ladder(ppl_at)
    chooser = LayerChoice(text, 4.5, max_bits)
    sizes = [10] * 100  # a hundred units of equal size: the share of k units is k %

    def use(k):
        text.current = k / 100

    count = chooser(None, sizes, 1000, use)
    return chooser, count, text.evaluated


def test_under_a_size_target_the_choice_keeps_as_many_layers_as_it_holds_in_one_run():
    """A target of 23 % of the weights in 8 bits: that share exactly (not a rung of the ladder below it), judged once,
    even where every layer in INT4 would hold the budget: the size is spent on accuracy, as llama.cpp's Q4_K_M does."""
    cap = 4.5 + 0.23 * (INT8_BITS - 4.5)
    chooser, count, evaluated = search(lambda share: 0.01, max_bits=cap)
    assert count == 23 and chooser.chosen["passed"] and evaluated == [0.23]
    assert chooser.chosen["bits"] == pytest.approx(cap, abs=1e-3)
    found = chooser.to_json()
    assert found["held"] and found["model_bits"] == pytest.approx(cap, abs=1e-3) and found["more"]["share"] == 0.3


def test_the_search_finds_the_smallest_share_that_holds_by_bisection():
    chooser, count, evaluated = search(lambda share: 0.2 - share)  # ppl_delta <= 0.085 from share 0.115
    assert chooser.chosen["share"] == 0.15 and count == 15 and chooser.chosen["passed"]
    # none first, then a bisection as if the pool's most held: that one, seldom chosen, is never run
    assert evaluated[0] == 0.0 and POOL_SHARE not in evaluated and len(evaluated) <= 4 < len(CHOICE_SHARES)
    chooser, count, evaluated = search(lambda share: 0.5 - share)  # only the pool's most holds: run last
    assert chooser.chosen["share"] == POOL_SHARE and chooser.chosen["passed"] and evaluated[-1] == POOL_SHARE
    chooser, count, evaluated = search(lambda share: 0.01)  # every layer in INT4 holds it: one run decides
    assert count == 0 and evaluated == [0.0]


def test_under_a_cap_no_share_holds_and_the_cap_that_would_is_named():
    cap = 4.5 + 0.1 * (INT8_BITS - 4.5)  # 10 % of the weights in 8 bits
    chooser, count, _ = search(lambda share: 0.2 - share, max_bits=cap)
    found = chooser.to_json()
    assert count == 10 and not found["held"] and found["would_pass"]["share"] == 0.15
    said = advice(found)
    assert f"--max-bits-per-weight {found['would_pass']['model_bits']:g} held it" in said
    assert found["would_pass"]["model_bits"] == pytest.approx(4.5 + 0.15 * (INT8_BITS - 4.5), abs=1e-3)
    # held on the choice's text and failed on --val: the flag that keeps the next share
    chooser, _, _ = search(lambda share: 0.2 - share)
    said = advice(chooser.to_json())
    assert f"--max-bits-per-weight {4.5 + 0.2 * (INT8_BITS - 4.5):.4g} keeps 20%" in said and "recipe" not in said


def test_the_mixed_strategy_picks_the_builders_blocks_and_roles():
    """Of 30 blocks, the first four, the last three and every third between (14, as ONNX Runtime GenAI's builder
    picks for SmolLM2), and in each the attention's input projections and the MLP's down projection."""
    roles = ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj",
             "mlp.up_proj", "mlp.down_proj"]
    blocks = [[f"model.layers.{i}.{r}" for r in roles] for i in range(30)]
    chosen = mixed_layers(blocks)
    picked = sorted({int(name.split(".")[2]) for name in chosen})
    assert picked == [0, 1, 2, 3, 6, 9, 12, 15, 18, 21, 24, 27, 28, 29]
    assert {name.split(".", 3)[3] for name in chosen} == {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                                                         "mlp.down_proj"}
    gpt2 = [[f"transformer.h.{i}.{r}" for r in ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj")]
            for i in range(12)]
    assert [n for n in mixed_layers(gpt2) if n.startswith("transformer.h.0.")] == ["transformer.h.0.attn.c_attn",
                                                                                 "transformer.h.0.mlp.c_proj"]


@pytest.mark.parametrize("method", ["rtn", "gptq", "awq"])
def test_layers_kept_for_8_bits_are_held_in_int4_so_the_decoder_layers_stay_alike(method):
    """The layers kept for 8 bits go back in the module as their INT4 layers, their float Linears held aside for
    the export: every block is built alike, so the decoder is captured with two and stamped (the RTN rule and
    the GPTQ choice alike), and the held floats go back once the export is done. The weight the export
    writes in 8 bits gives the float layer's output from the input the INT4 layer reads in the graph (AWQ's
    divided by its input scale)."""
    import torch

    from infopt.exporters.layer_probe import plan
    from infopt.passes.fx.int4_eight_bit import held_in_int4
    from infopt.quantize.int4_config import AWQConfig, GPTQConfig, RTNConfig
    from infopt.quantize.weight_only import layer_groups, quantize_int4

    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=8,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    lm = transformers.LlamaForCausalLM(config).eval()
    names = [n for n, m in lm.named_modules() if isinstance(m, torch.nn.Linear) and n != "lm_head"]
    if method == "rtn":
        rule = mixed_layers([members for block, members in layer_groups(lm, names) if block is not None])
        result = quantize_int4(lm, RTNConfig(group_size=32), for_8bit=rule)
        assert sorted(result.for_8bit) == sorted(rule)
    else:
        config = (GPTQConfig if method == "gptq" else AWQConfig)(group_size=32)
        result = quantize_int4(lm, config, [(torch.tensor(windows(4, 1)),)], int8_share=0.3)
    assert result.for_8bit and all(type(lm.get_submodule(n)).__name__ == "Linear" for n in result.for_8bit)
    held = held_in_int4(lm, result)
    if method != "awq":  # AWQ keeps an input scale only on the layers where one beat plain rounding: not alike
        assert isinstance(plan(lm, 8), tuple)  # every layer alike: (path, layers), not a reason
    assert all(type(lm.get_submodule(n)).__name__ == "Int4Linear" for n in result.for_8bit)
    weight, _ = held.weight(result.for_8bit[0])
    assert weight.dtype == torch.float32 and weight.shape[1] == 64
    scales = []
    for name in result.for_8bit:
        x = torch.randn(5, held.floats[name].in_features)
        scale = lm.get_submodule(name).input_scale
        scales.append(scale is not None)
        read = x if scale is None else x / scale  # what the INT4 layer's op receives
        torch.testing.assert_close(read @ held.weight(name)[0].T, held.floats[name](x), rtol=1e-4, atol=1e-5)
    assert any(scales) == (method == "awq")
    held.restore()
    assert all(type(lm.get_submodule(n)).__name__ == "Linear" for n in result.for_8bit)
