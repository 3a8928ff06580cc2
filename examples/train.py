"""Train the example models on real or generated data and save them the ways users do.

``python examples/train.py --out examples/out`` writes:

- ``digits_cnn.pt`` (TorchScript), ``digits_cnn.state_dict.pt``, ``digits_val.npz`` (held-out
  digits, never trained on) and ``digits_cnn.json`` (accuracy);
- ``tiny_encoder.pt2`` (torch.export, dynamic batch and sequence), ``tiny_encoder.state_dict.pt``,
  ``tiny_encoder_val.npz`` and ``tiny_encoder.json``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch
from torch import nn

from examples.models import DigitsCNN, TinyEncoder


def digits_data(seed: int = 0):
    """scikit-learn's bundled 8x8 digits (no download), scaled to [0, 1], split 80/20."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    x = (digits.images / 16.0).astype(np.float32)[:, None]
    y = digits.target.astype(np.int64)
    order = np.random.default_rng(seed).permutation(len(x))
    cut = int(0.8 * len(x))
    return (x[order[:cut]], y[order[:cut]]), (x[order[cut:]], y[order[cut:]])


def fit(model: nn.Module, x: torch.Tensor, y: torch.Tensor, epochs: int, lr: float, batch: int = 64, seed: int = 0):
    torch.manual_seed(seed)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    model.train()
    for _ in range(epochs):
        for idx in torch.randperm(len(x)).split(batch):
            opt.zero_grad()
            nn.functional.cross_entropy(model(x[idx]), y[idx]).backward()
            opt.step()
    return model.eval()


def accuracy(model: nn.Module, x: np.ndarray, y: np.ndarray) -> float:
    with torch.inference_mode():
        return float((model(torch.from_numpy(x)).argmax(1).numpy() == y).mean())


def train_digits(seed: int = 0, epochs: int = 15) -> tuple[DigitsCNN, dict]:
    (xtr, ytr), (xte, yte) = digits_data(seed)
    torch.manual_seed(seed)
    model = fit(DigitsCNN(), torch.from_numpy(xtr), torch.from_numpy(ytr), epochs, 3e-3, seed=seed)
    return model, {"train": (xtr, ytr), "val": (xte, yte), "accuracy": accuracy(model, xte, yte)}


def token_task(n: int, seq: int, vocab: int = 32, seed: int = 0):
    """Label a sequence 1 when more than half of its tokens are in the lower half of the vocabulary."""
    rng = np.random.default_rng(seed)
    p = rng.uniform(0.2, 0.8, size=(n, 1))
    ids = np.where(rng.random((n, seq)) < p, rng.integers(0, vocab // 2, (n, seq)), rng.integers(vocab // 2, vocab, (n, seq)))
    labels = ((ids < vocab // 2).mean(1) > 0.5).astype(np.int64)
    return ids.astype(np.int64), labels


def train_encoder(seed: int = 0, steps: int = 300) -> tuple[TinyEncoder, dict]:
    xtr, ytr = token_task(4096, 16, seed=seed)
    xte, yte = token_task(512, 16, seed=seed + 1)
    torch.manual_seed(seed)
    model = fit(TinyEncoder(), torch.from_numpy(xtr), torch.from_numpy(ytr), epochs=max(1, steps // 64), lr=2e-3, seed=seed)
    return model, {"train": (xtr, ytr), "val": (xte, yte), "accuracy": accuracy(model, xte, yte)}


def save_all(out: Path) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    cnn, data = train_digits()
    xte, yte = data["val"]
    torch.jit.save(torch.jit.trace(cnn, torch.from_numpy(xte[:2])), str(out / "digits_cnn.pt"))
    torch.save(cnn.state_dict(), out / "digits_cnn.state_dict.pt")
    np.savez(out / "digits_val.npz", x=xte, labels=yte)
    enc, edata = train_encoder()
    ids, labels = edata["val"]
    from torch.export import Dim

    program = torch.export.export(enc, (torch.from_numpy(ids[:4]),),
                                  dynamic_shapes=({0: Dim("batch", min=1, max=64), 1: Dim("seq", min=2, max=64)},))
    torch.export.save(program, str(out / "tiny_encoder.pt2"))
    torch.save(enc.state_dict(), out / "tiny_encoder.state_dict.pt")
    np.savez(out / "tiny_encoder_val.npz", input_ids=ids, labels=labels)
    summary = {"digits_cnn": {"accuracy": data["accuracy"], "val_samples": int(len(xte))},
               "tiny_encoder": {"accuracy": edata["accuracy"], "val_samples": int(len(ids))}}
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("examples/out"))
    args = parser.parse_args()
    summary = save_all(args.out)
    for name, info in summary.items():
        print(f"trained {name}: held-out accuracy {info['accuracy']:.3f} on {info['val_samples']} samples")


if __name__ == "__main__":
    main()
