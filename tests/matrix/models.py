"""Five small architectures that differ where builds break: BatchNorm, attention, recurrence,
widths that no INT4 group size divides, several inputs and outputs. Each is importable by
``--model-class tests.matrix.models:<Class>`` and carries its input spec and a sample maker."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn


class ConvBN(nn.Module):
    """Conv + BatchNorm + ReLU twice, pooled, then a Linear head."""

    inputs = ["x:float32[batch,3,16,16]"]

    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
            nn.Conv2d(16, 32, 3, padding=1, stride=2), nn.BatchNorm2d(32), nn.ReLU(),
            nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.head = nn.Linear(32, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


class AttentionEncoder(nn.Module):
    """``nn.TransformerEncoder`` (``nn.MultiheadAttention`` inside) over a float sequence, mean-pooled."""

    inputs = ["x:float32[batch,seq,64]"]

    def __init__(self) -> None:
        super().__init__()
        layer = nn.TransformerEncoderLayer(d_model=64, nhead=4, dim_feedforward=128, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, num_layers=1, enable_nested_tensor=False)
        self.head = nn.Linear(64, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(x).mean(dim=1))


class Recurrent(nn.Module):
    """An LSTM then a GRU over a sequence; the last step goes to a Linear head. torch.export unrolls
    recurrent layers over time, so the sequence length is fixed (a dynamic one is a capture error);
    4 steps keep the unrolled graph, and its AOTInductor compile, short."""

    inputs = ["x:float32[batch,4,12]"]

    def __init__(self) -> None:
        super().__init__()
        self.lstm = nn.LSTM(12, 32, batch_first=True)
        self.gru = nn.GRU(32, 32, batch_first=True)
        self.head = nn.Linear(32, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden, _ = self.lstm(x)
        hidden, _ = self.gru(hidden)
        return self.head(hidden[:, -1])


class OddMLP(nn.Module):
    """Widths 37 -> 96 -> 50 -> 7: only the 96-wide input has an INT4 group size (32) that divides it."""

    inputs = ["x:float32[batch,37]"]

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(37, 96), nn.GELU(), nn.Linear(96, 50), nn.LayerNorm(50), nn.ReLU(),
                                 nn.Linear(50, 7))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class TwoHeads(nn.Module):
    """Two inputs, two outputs: features and a mask-like second input, a score and an embedding."""

    inputs = ["a:float32[batch,16]", "b:float32[batch,8]"]

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(16, 64)
        self.b = nn.Linear(8, 64)
        self.mix = nn.Linear(64, 64)
        self.score = nn.Linear(64, 3)

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        hidden = torch.relu(self.a(a) + self.b(b))
        embedding = self.mix(hidden)
        return self.score(embedding), embedding


ARCHITECTURES = {cls.__name__: cls for cls in (ConvBN, AttentionEncoder, Recurrent, OddMLP, TwoHeads)}


def make(name: str, seed: int = 0) -> nn.Module:
    """The architecture with seeded weights and BatchNorm statistics that are not the identity."""
    torch.manual_seed(seed)
    model = ARCHITECTURES[name]()
    for module in model.modules():
        if isinstance(module, nn.BatchNorm2d):
            module.running_mean.uniform_(-0.5, 0.5)
            module.running_var.uniform_(0.5, 2.0)
    return model.eval()


def samples(name: str, count: int, seed: int = 0, seq: int = 6) -> dict[str, np.ndarray]:
    """``count`` input samples for the architecture, as the arrays of one ``.npz``."""
    from infopt.core.inputspec import InputSpec

    rng = np.random.default_rng(seed)
    spec = InputSpec.parse(ARCHITECTURES[name].inputs)
    out = {}
    for tensor in spec.inputs:
        shape = [count if d == "batch" else seq if d == "seq" else d for d in tensor.shape]
        out[tensor.name] = rng.standard_normal(shape).astype(np.float32)
    return out


DIMS = {"batch": (1, 2, 4), "seq": (2, 6, 8)}
"""Small ranges: the matrix checks that builds work, and a short latency curve keeps it fast."""

SOURCE_FORMATS = ("state_dict", "torchscript", "pt2", "onnx")


def save(name: str, fmt: str, folder) -> tuple[str, list[str]]:
    """Save the architecture as a user would in ``fmt``; the file name and the CLI arguments that load it."""
    from pathlib import Path

    from infopt.core.inputspec import DimRange, InputSpec
    from infopt.exporters.torch_export import dynamic_shapes

    folder = Path(folder)
    model = make(name)
    spec = InputSpec.parse(ARCHITECTURES[name].inputs)
    spec = spec.with_dims({k: DimRange(*v) for k, v in DIMS.items() if k in spec.dims})
    example = tuple(torch.from_numpy(v) for v in samples(name, 2).values())
    args = [arg for text in ARCHITECTURES[name].inputs for arg in ("--input", text)]
    if fmt == "state_dict":
        file = f"{name}_sd.pt"
        torch.save(model.state_dict(), folder / file)
        return file, [*args, "--model-class", f"tests.matrix.models:{name}"]
    if fmt == "torchscript":
        file = f"{name}_ts.pt"
        torch.jit.save(torch.jit.trace(model, example, check_trace=False), str(folder / file))
        return file, args
    program = torch.export.export(model, example, dynamic_shapes=dynamic_shapes(spec))
    if fmt == "pt2":
        file = f"{name}.pt2"
        torch.export.save(program, str(folder / file))
        return file, []
    file = f"{name}.onnx"
    torch.onnx.export(program, (), str(folder / file), dynamo=True, input_names=spec.names, external_data=False)
    return file, []
