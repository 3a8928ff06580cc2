"""The small models that infopt's demo, tests and benchmarks train and build.

- ``DigitsCNN``: conv-BN-ReLU blocks, dropout and a linear head over 8x8 digit images
  (scikit-learn's bundled ``load_digits``).
- ``TinyEncoder``: a two-layer pre-norm transformer encoder over token ids, mean-pooled into a
  classifier head; both the batch and the sequence length are dynamic.
- ``WithExtraWork``: any model plus work that does not change its predictions (a slower release).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


class DigitsCNN(nn.Module):
    def __init__(self, channels: int = 16, num_classes: int = 10, dropout: float = 0.1):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, channels, 3, padding=1, bias=False), nn.BatchNorm2d(channels), nn.ReLU(),
            nn.Conv2d(channels, 2 * channels, 3, padding=1), nn.BatchNorm2d(2 * channels), nn.ReLU(),
            nn.MaxPool2d(2),
        )
        self.dropout = nn.Dropout(dropout)
        self.head = nn.Sequential(nn.Identity(), nn.Linear(2 * channels * 4 * 4, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.dropout(self.features(x).flatten(1)))


class SelfAttention(nn.Module):
    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.out = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        q, k, v = self.qkv(x).reshape(b, s, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v)
        return self.out(y.transpose(1, 2).reshape(b, s, d))


class Block(nn.Module):
    def __init__(self, dim: int, heads: int, dropout: float):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attn = SelfAttention(dim, heads)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.drop(self.attn(self.norm1(x)))
        return x + self.drop(self.mlp(self.norm2(x)))


class TinyEncoder(nn.Module):
    def __init__(self, vocab: int = 32, dim: int = 64, heads: int = 4, layers: int = 2, max_len: int = 64,
                 num_classes: int = 2, dropout: float = 0.1):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.pos = nn.Parameter(torch.randn(1, max_len, dim) / math.sqrt(dim))
        self.blocks = nn.ModuleList(Block(dim, heads, dropout) for _ in range(layers))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, num_classes)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(input_ids) + self.pos[:, : input_ids.shape[1]]
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x).mean(dim=1))


class WithExtraWork(nn.Module):
    """A model plus a wide MLP on its flattened input whose result barely touches the output: the
    same predictions for several times the work. The release gate's tests and benchmark use it as a
    candidate that got slower."""

    def __init__(self, model: nn.Module, in_features: int = 64, width: int = 1024):
        super().__init__()
        self.model = model
        g = torch.Generator().manual_seed(0)
        self.w1 = nn.Parameter(torch.randn(in_features, width, generator=g) / in_features ** 0.5, requires_grad=False)
        self.w2 = nn.Parameter(torch.randn(width, width, generator=g) / width ** 0.5, requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        extra = torch.tanh(torch.tanh(x.flatten(1) @ self.w1) @ self.w2)
        return self.model(x) + 1e-9 * extra.mean(dim=1, keepdim=True)
