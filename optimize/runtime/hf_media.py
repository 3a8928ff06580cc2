"""Hugging Face image and audio models: the input a model reads, from its config.

transformers names each model's input (``main_input_name``): ``pixel_values`` for vision models
(ViT, DeiT, BEiT, Swin, DINOv2, ConvNeXt, ResNet...), ``input_values`` for raw-audio encoders
(wav2vec2, HuBERT, WavLM), ``input_features`` for Whisper's encoder. Such a model is built from that one input, not from tokens:

- ``pixel_values: float32[batch, num_channels, image_size, image_size]`` (the config's sizes; 3 and
  224 where it has none);
- ``input_values: float32[batch, samples]``, 1 to 4 seconds at 16 kHz by default (``--dim samples=``);
- ``input_features: float32[batch, num_mel_bins, 2 * max_source_positions]`` (Whisper's encoder, as in
  WhisperForAudioClassification: log-mel frames, the length its positions fix).

The output is ``logits`` for a model with a task head (``*For<Task>``), else ``pooler_output`` for a
convolutional backbone (ConvNeXt, ResNet: its last state is a feature map), else ``last_hidden_state``. Text models keep the token inputs of
:mod:`infopt.runtime.hf_folder`; an encoder-decoder (BART, T5, Marian, Whisper) is refused there
with what to build instead.
"""

from __future__ import annotations

from infopt.core.inputspec import DimRange, InputSpec

MEDIA_INPUTS = ("pixel_values", "input_values", "input_features")
AUDIO_RATE = 16000


def media_input(model) -> str | None:
    """The name of the one input ``model`` reads when it is an image or audio model, else None."""
    name = getattr(model, "main_input_name", None)
    return name if name in MEDIA_INPUTS else None


def media_spec(name: str, config: dict) -> InputSpec:
    if name == "pixel_values":
        channels = int(config.get("num_channels") or 3)
        size = config.get("image_size") or 224
        side = int(size[0] if isinstance(size, (list, tuple)) else size)
        return InputSpec.parse([f"pixel_values:float32[batch,{channels},{side},{side}]"])
    if name == "input_features":  # Whisper's encoder: log-mel frames, exactly twice its source positions
        mels, frames = int(config.get("num_mel_bins") or 80), 2 * int(config.get("max_source_positions") or 1500)
        return InputSpec.parse([f"input_features:float32[batch,{mels},{frames}]"])
    spec = InputSpec.parse(["input_values:float32[batch,samples]"])
    return spec.with_dims({"samples": DimRange(AUDIO_RATE, AUDIO_RATE, 4 * AUDIO_RATE)})


def media_wrapper_class():
    import torch
    from torch import nn

    class HFMediaModel(nn.Module):
        """The model's one image or audio input -> one tensor (see the module docstring)."""

        def __init__(self, model: nn.Module, source_dir: str, input_name: str):
            super().__init__()
            self.model = model
            self.source_dir = source_dir
            self.input_name = input_name
            task_head = "For" in type(model).__name__
            # a convolutional backbone (a ``hidden_sizes`` list per stage) ends in feature maps: its pooled vector
            stages = isinstance(getattr(model.config, "hidden_sizes", None), (list, tuple)) and hasattr(model, "pooler")
            self.output_key = "logits" if task_head else "pooler_output" if stages else "last_hidden_state"

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            out = self.model(**{self.input_name: x}, return_dict=True)
            value = out[self.output_key]
            return value.flatten(1) if self.output_key == "pooler_output" and value.dim() == 4 else value

    return HFMediaModel
