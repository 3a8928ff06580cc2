"""The text-generation tests' decoders: the zoo's causal LMs with a few layers, their norms random, each saved with a
byte-level BPE tokenizer trained on the test sentences."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.cli import ROOT
from tests.support.zoo import FAMILIES

transformers = pytest.importorskip("transformers")

SENTENCES = ROOT / "tests" / "data" / "sentences.txt"
DECODERS = ("llama", "gpt2", "qwen2", "mistral", "phi3", "gemma", "qwen3", "gptneox", "opt")
EVERY_RUN = {"llama", "gpt2"}
"""the families ``make test`` builds (rotary with grouped KV heads, and learned positions); ``make zoo`` builds all"""
LAYERS = 4
"""the decoders' layers here: more than the probe's two, so that every build stamps two layers from the second"""


def tokenizer_for(folder: Path) -> None:
    """A byte-level BPE tokenizer of 512 tokens trained on the test sentences, saved into ``folder``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.train([str(SENTENCES)], trainers.BpeTrainer(vocab_size=512, special_tokens=["<|endoftext|>"],
                                                          initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    transformers.PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token="<|endoftext|>",
                                         bos_token="<|endoftext|>").save_pretrained(folder)


def with_layers(family: str, layers: int = LAYERS):
    """The zoo's tiny ``family`` with ``layers`` layers (seeded), its norms' weights random too (a checkpoint whose
    norms are all ones would not show a norm read from the wrong layer)."""
    import torch

    config = FAMILIES[family]().config
    config.num_hidden_layers = layers
    types = getattr(config, "layer_types", None)
    if types:
        config.layer_types = [types[i % len(types)] for i in range(layers)]
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():
        for name, tensor in model.named_parameters():
            if "norm" in name and tensor.dim() == 1:
                tensor.add_(torch.randn_like(tensor) * 0.1)
    return model


def decoder(folder: Path, family: str) -> Path:
    """``tiny-<family>`` (:data:`LAYERS` layers) in ``folder`` with its tokenizer, saved on first use."""
    path = folder / f"tiny-{family}"
    if not path.exists():
        with_layers(family).save_pretrained(path)
        tokenizer_for(path)
    return path


TRAIN_LINES = 440
"""the sentences ``train_lm`` learns from; the rest are held out"""
STEPS = 150


def train_lm(folder: Path, tied: bool = False) -> None:
    """A 2-layer Llama (hidden 128, 4 heads, 2 KV heads, its head untied unless ``tied``) trained on the first
    sentences, saved with its tokenizer."""
    import torch

    tokenizer_for(folder)
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    lines = [s for s in SENTENCES.read_text().splitlines() if s.strip()][:TRAIN_LINES]
    ids = torch.tensor([t for line in lines for t in tokenizer(line)["input_ids"] + [tokenizer.eos_token_id]])
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=512, hidden_size=128, intermediate_size=384, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                                      bos_token_id=0, eos_token_id=0, tie_word_embeddings=tied)
    lm = transformers.LlamaForCausalLM(config)
    optimizer = torch.optim.AdamW(lm.parameters(), lr=3e-3, weight_decay=0.01)
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, 3e-3, total_steps=STEPS, pct_start=0.1)
    draw = torch.Generator().manual_seed(0)
    for _ in range(STEPS):
        starts = torch.randint(0, len(ids) - 65, (16,), generator=draw)
        batch = torch.stack([ids[i:i + 64] for i in starts])
        loss = lm(input_ids=batch, labels=batch).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        schedule.step()
    lm.eval().save_pretrained(folder)
