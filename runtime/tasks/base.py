"""What every task descriptor gives: how to tell a model is its kind, the inputs it reads (from the
config), the module that exports it (one tensor out, named after the head), how it is judged, and
how raw data of its kind (text lines, images, audio files) becomes samples for ``--val`` and ``--calib``."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np

from infopt.core.inputspec import InputSpec

Samples = Iterator[tuple[str, dict[str, np.ndarray]]]
"""(where, arrays by input name), one raw example each"""


@dataclass(frozen=True)
class Task:
    name: str
    """as the manifest records it: feature-extraction, sentence-embedding, classification, causal-lm, image, audio"""
    judged_by: str
    """the drift figure that tells this task's outputs apart: cosine, or top-1 for a classifier's logits"""
    matches: Callable[[Any, Path, dict], bool]
    """(transformers model, folder, config.json) -> whether this task is the model's"""
    spec: Callable[[Any, Path, dict], InputSpec]
    """the inputs the model reads, with their default ranges"""
    module: Callable[[Any, Path], Any]
    """the ``nn.Module`` that is exported: the model's inputs in, one tensor out; its ``output_key`` names it"""
    raw_suffixes: tuple[str, ...] = ()
    """file suffixes of the raw data this task reads for --val and --calib (besides .npy/.npz/.pt)"""
    read_raw: Callable[[list[Path], InputSpec, Path], Samples] | None = None
    """(files, spec, model folder) -> samples, through the folder's tokenizer, image processor or feature extractor"""

    def raw_files(self, source: Any) -> list[Path] | None:
        """The raw files ``source`` names when it is a file or folder of this task's kind, else None."""
        if not self.raw_suffixes or not isinstance(source, (str, Path)) or not Path(source).exists():
            return None
        path = Path(source)
        files = sorted(p for p in path.iterdir() if p.suffix.lower() in self.raw_suffixes) if path.is_dir() else (
            [path] if path.suffix.lower() in self.raw_suffixes else [])
        return files or None


def has_head(model) -> bool:
    """transformers names models with a task head ``*For<Task>`` (CausalLM, MaskedLM, ImageClassification...)."""
    return "For" in type(model).__name__
