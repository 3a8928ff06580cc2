"""llama.cpp's Q4_K_M mix, read from its rules: the default size target of INT4 text generation."""

from __future__ import annotations

from infopt.quantize.llama_cpp_types import BITS, Tensor, more_bits, q4_k_m_bits, q4_k_m_type


def smollm2_tensors(tied: bool) -> list[Tensor]:
    """SmolLM2-135M's weights: 30 layers of width 576 (3 KV heads of 64), an MLP of 1536, a 49152-token table."""
    shapes = {"self_attn.q_proj": (576, 576), "self_attn.k_proj": (192, 576), "self_attn.v_proj": (192, 576),
              "self_attn.o_proj": (576, 576), "mlp.gate_proj": (1536, 576), "mlp.up_proj": (1536, 576),
              "mlp.down_proj": (576, 1536)}
    tensors = [Tensor(f"model.layers.{i}.{name}", rows * cols, cols, layer=i)
               for i in range(30) for name, (rows, cols) in shapes.items()]
    tensors.append(Tensor("lm_head", 49152 * 576, 576, head=True))
    if not tied:
        tensors.append(Tensor("model.embed_tokens", 49152 * 576, 576))
    return tensors


def test_the_layers_given_more_bits_are_llama_cpps():
    assert [i for i in range(30) if more_bits(i, 30)] == [0, 1, 2, 5, 8, 11, 14, 17, 20, 23, 26, 27, 28, 29]
    assert [i for i in range(32) if more_bits(i, 32)] == [0, 1, 2, 3, 6, 9, 12, 15, 18, 21, 24, 27, 28, 29, 30, 31]


def test_rows_that_are_not_whole_super_blocks_fall_back_and_the_others_stay_k_quants():
    assert q4_k_m_type("model.layers.5.self_attn.v_proj", 5, 30, 576) == "Q8_0"  # Q6_K, 576 wide
    assert q4_k_m_type("model.layers.4.self_attn.v_proj", 4, 30, 576) == "Q5_0"  # Q4_K, 576 wide
    assert q4_k_m_type("model.layers.5.mlp.down_proj", 5, 30, 1536) == "Q6_K"
    assert q4_k_m_type("model.layers.4.mlp.down_proj", 4, 30, 1536) == "Q4_K"
    assert q4_k_m_type("model.layers.5.self_attn.q_proj", 5, 30, 4096) == "Q4_K"
    assert q4_k_m_type("lm_head", None, 30, 4096, head=True) == "Q6_K"


def test_the_mix_is_the_size_llama_quantize_wrote_for_smollm2():
    """``llama-quantize rotated-f32.gguf out.gguf Q4_K_M`` (llama.cpp of llama-cpp-python 0.3.36) on SmolLM2 with
    its head untied wrote 122,992,128 bytes of quantized tensors: Q5_0 73,142,784, Q8_0 31,726,080, Q6_K 10,160,640,
    Q4_K 7,962,624 (read with the gguf package); tied, the table serves as the head (Q6_K, so Q8_0 here)."""
    untied = smollm2_tensors(tied=False)
    assert round(q4_k_m_bits(untied) * sum(t.parameters for t in untied) / 8) == 122_992_128
    tied = smollm2_tensors(tied=True)
    untied_bytes = q4_k_m_bits(untied) * sum(t.parameters for t in untied) / 8
    assert q4_k_m_bits(tied) * sum(t.parameters for t in tied) / 8 == untied_bytes - 49152 * 576 * BITS["Q5_0"] / 8
