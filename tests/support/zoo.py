"""transformers' own architectures as tiny random models, one per family: the zoo's cells build them, the
text-generation tests build its decoders. A new family goes here once (docs/contributing/add-an-architecture.md)."""

from __future__ import annotations

import pytest

transformers = pytest.importorskip("transformers")

SMALL = dict(vocab_size=512, max_position_embeddings=64)
DECODER = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)
ENCODER = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4)

FAMILIES = {
    "llama": lambda: transformers.LlamaForCausalLM(transformers.LlamaConfig(**SMALL, **DECODER)),
    "qwen2": lambda: transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**SMALL, **DECODER)),
    "mistral": lambda: transformers.MistralForCausalLM(transformers.MistralConfig(**SMALL, **DECODER)),
    "gpt2": lambda: transformers.GPT2LMHeadModel(transformers.GPT2Config(vocab_size=512, n_positions=64, n_embd=64,
                                                                         n_layer=2, n_head=4, bos_token_id=0,
                                                                         eos_token_id=0)),
    "bert": lambda: transformers.BertModel(transformers.BertConfig(**SMALL, **ENCODER)),
    "electra-tokens": lambda: transformers.ElectraForTokenClassification(transformers.ElectraConfig(
        **SMALL, embedding_size=64, **ENCODER, num_labels=5)),
    "vit": lambda: transformers.ViTForImageClassification(transformers.ViTConfig(
        image_size=32, patch_size=8, num_labels=10, **ENCODER)),
    "resnet": lambda: transformers.ResNetModel(transformers.ResNetConfig(embedding_size=16, hidden_sizes=[16, 32],
                                                                         depths=[1, 1])),
    "wav2vec2": lambda: transformers.Wav2Vec2ForCTC(transformers.Wav2Vec2Config(
        vocab_size=32, **ENCODER, conv_dim=(32, 32), conv_stride=(5, 4), conv_kernel=(10, 4),
        num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=4)),
    "bart": lambda: transformers.BartModel(transformers.BartConfig(
        **SMALL, d_model=64, encoder_layers=1, decoder_layers=1, encoder_attention_heads=4, decoder_attention_heads=4,
        encoder_ffn_dim=128, decoder_ffn_dim=128)),
    "gptneox": lambda: transformers.GPTNeoXForCausalLM(transformers.GPTNeoXConfig(**SMALL, **ENCODER)),
    "opt": lambda: transformers.OPTForCausalLM(transformers.OPTConfig(
        **SMALL, hidden_size=64, ffn_dim=128, num_hidden_layers=2, num_attention_heads=4, word_embed_proj_dim=64)),
    "gemma": lambda: transformers.GemmaForCausalLM(transformers.GemmaConfig(**SMALL, **DECODER, head_dim=16)),
    "qwen3": lambda: transformers.Qwen3ForCausalLM(transformers.Qwen3Config(**SMALL, **DECODER, head_dim=16)),
    "phi3": lambda: transformers.Phi3ForCausalLM(transformers.Phi3Config(**SMALL, **DECODER, pad_token_id=0)),
    "smollm": lambda: transformers.LlamaForCausalLM(transformers.LlamaConfig(  # SmolLM-135M's widths, 2 layers
        **SMALL, hidden_size=576, intermediate_size=1536, num_hidden_layers=2, num_attention_heads=9,
        num_key_value_heads=3)),
    "roberta": lambda: transformers.RobertaModel(transformers.RobertaConfig(vocab_size=512, max_position_embeddings=66,
                                                                            **ENCODER)),
    "xlmr-classifier": lambda: transformers.XLMRobertaForSequenceClassification(transformers.XLMRobertaConfig(
        vocab_size=512, max_position_embeddings=66, **ENCODER, num_labels=3)),
    "debertav2": lambda: transformers.DebertaV2Model(transformers.DebertaV2Config(**SMALL, **ENCODER)),
    "modernbert-mlm": lambda: transformers.ModernBertForMaskedLM(transformers.ModernBertConfig(
        **SMALL, **ENCODER, pad_token_id=0, bos_token_id=1, eos_token_id=2, cls_token_id=1, sep_token_id=2)),
    "t5-encoder": lambda: transformers.T5EncoderModel(transformers.T5Config(
        vocab_size=512, d_model=64, d_kv=16, d_ff=128, num_layers=2, num_heads=4)),
    "convnext": lambda: transformers.ConvNextForImageClassification(transformers.ConvNextConfig(
        num_stages=2, hidden_sizes=[16, 32], depths=[1, 1], image_size=32, num_labels=5)),
    "swin": lambda: transformers.SwinModel(transformers.SwinConfig(
        image_size=32, patch_size=4, embed_dim=16, depths=[1, 1], num_heads=[2, 2], window_size=4)),
    "clip-vision": lambda: transformers.CLIPVisionModel(transformers.CLIPVisionConfig(image_size=32, patch_size=8,
                                                                                       **ENCODER)),
    "whisper-encoder": lambda: transformers.WhisperForAudioClassification(transformers.WhisperConfig(
        vocab_size=512, d_model=64, encoder_layers=1, decoder_layers=1, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128, num_mel_bins=16, max_source_positions=32)),
    "distilbert": lambda: transformers.DistilBertModel(transformers.DistilBertConfig(
        vocab_size=512, max_position_embeddings=64, dim=64, hidden_dim=128, n_layers=2, n_heads=4)),
    "clip-image-embeds": lambda: transformers.CLIPVisionModelWithProjection(transformers.CLIPVisionConfig(
        image_size=32, patch_size=8, **ENCODER, projection_dim=32)),
    "mixtral": lambda: transformers.MixtralForCausalLM(transformers.MixtralConfig(
        **SMALL, **DECODER, num_local_experts=4, num_experts_per_tok=2)),
    "bert-qa": lambda: transformers.BertForQuestionAnswering(transformers.BertConfig(**SMALL, **ENCODER)),
}

TOKEN_TYPES = {"bert", "electra-tokens", "bert-qa", "roberta", "xlmr-classifier"}
"""the text families whose token-type table has two rows (the RoBERTa and XLM-R configs' default, though their
released checkpoints have one row, and are built without the input; DeBERTa-v2's default has none): they read
``token_type_ids`` too"""
