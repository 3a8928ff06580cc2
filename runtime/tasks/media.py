"""What the image and audio tasks share: the wrapper that feeds a model its one input by name and
answers the head's tensor, and the folder's processor that turns raw files into that input."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from infopt.core.errors import EnvironmentProblem, UsageError, first_line


def output_key(model) -> str:
    """``logits`` for a model with a task head (``*For<Task>``), ``image_embeds`` for a vision tower
    with its projection (``*WithProjection``), else ``pooler_output`` for a convolutional backbone
    (ConvNeXt, ResNet: its last state is a feature map), else ``last_hidden_state``."""
    if "For" in type(model).__name__:
        return "logits"
    if type(model).__name__.endswith("WithProjection"):  # CLIP's and SigLIP's vision tower with its projection
        return "image_embeds"
    stages = isinstance(getattr(model.config, "hidden_sizes", None), (list, tuple)) and hasattr(model, "pooler")
    return "pooler_output" if stages else "last_hidden_state"


def wrapper_class():
    import torch
    from torch import nn

    class HFMediaModel(nn.Module):
        """The model's one image or audio input -> one tensor (:func:`output_key`)."""

        def __init__(self, model: nn.Module, source_dir: str, input_name: str):
            super().__init__()
            self.model = model
            self.source_dir = source_dir
            self.input_name = input_name
            self.output_key = output_key(model)
            self.output_keys = (self.output_key,)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            out = self.model(**{self.input_name: x}, return_dict=True)
            value = out[self.output_key]
            return value.flatten(1) if self.output_key == "pooler_output" and value.dim() == 4 else value

    return HFMediaModel


def processor(folder: Path, kind: str, what: str) -> Any:
    """The folder's image processor or feature extractor (``preprocessor_config.json``), as
    transformers' ``AutoImageProcessor`` / ``AutoFeatureExtractor`` loads it; none is an error that says what to do."""
    if not (folder / "preprocessor_config.json").is_file():
        raise UsageError(f"{folder} has no {what} (preprocessor_config.json) to read {kind} files with",
                         where=str(folder),
                         fix=f"save the model's {what} into the folder (processor.save_pretrained(FOLDER)), or pass "
                             ".npy/.npz samples of the model's input")
    try:
        import transformers
    except ImportError as exc:
        raise EnvironmentProblem(f"{kind} samples need transformers", fix="pip install 'infopt[llm]'") from exc
    loader = transformers.AutoImageProcessor if kind == "image" else transformers.AutoFeatureExtractor
    try:
        return loader.from_pretrained(str(folder))
    except Exception as exc:  # noqa: BLE001 - transformers raises many types for a bad config
        raise UsageError(f"transformers cannot load {folder}'s {what}: {first_line(exc)}", where=str(folder),
                         fix=f"re-save the {what} with save_pretrained") from exc
