"""Models that fail in the ways users' models fail, importable by --model-class in CLI tests."""

from __future__ import annotations

import torch
from torch import nn


class DataDependent(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        y = self.lin(x)
        if y.mean() > 0:
            return torch.relu(y)
        return y


class ConvOnly(nn.Module):
    """No Linear layer at all: nothing for INT4 weight-only quantization to work on."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 4, 3, padding=1)

    def forward(self, x):
        return torch.relu(self.conv(x)).mean(dim=(2, 3))


class LearnedPositions(nn.Module):
    """16 learned positions: a longer sequence indexes past the table. torch.export cannot see that
    (an index is data), so only running the model at the declared maximum length shows it."""

    def __init__(self):
        super().__init__()
        self.pos = nn.Embedding(16, 8)
        self.lin = nn.Linear(8, 4)

    def forward(self, x):
        return self.lin(x + self.pos(torch.arange(x.shape[1], device=x.device)))


class Hangs(nn.Module):
    """A model whose construction never ends (a download that stalls, a lock never released)."""

    def __init__(self):
        import time

        super().__init__()
        time.sleep(3600)


class KillsItsWorker(nn.Module):
    """A model whose loading kills the process that started the build (a sweep's Ray worker: a worker
    lost mid-cell), the first ``times`` times any build loads it; ``log`` counts the attempts."""

    def __init__(self, log: str, times: int = 1):
        import fcntl
        import os
        import signal

        super().__init__()
        self.lin = nn.Linear(4, 2)
        with open(log, "a+") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            f.seek(0)
            attempts = len(f.read().splitlines())
            f.write(f"{os.getppid()}\n")
        if attempts < times:
            os.kill(os.getppid(), signal.SIGKILL)
            os._exit(3)

    def forward(self, x):
        return self.lin(x)
