"""The audio task: a model whose input is ``input_values`` (raw 16 kHz samples: wav2vec2, HuBERT,
WavLM; ``float32[batch, samples]``, 1 to 4 seconds by default, ``--dim samples=``) or
``input_features`` (Whisper's encoder: ``float32[batch, num_mel_bins, 2 * max_source_positions]``
log-mel frames, the length its positions fix). Output: ``logits`` with a head, else the last hidden
state. Raw data for ``--val`` and ``--calib``: ``.wav`` files (PCM, at the feature extractor's
sampling rate; no resampling), through the folder's feature extractor."""

from __future__ import annotations

import wave
from pathlib import Path

import numpy as np

from infopt.core.errors import UsageError
from infopt.core.inputspec import DimRange, InputSpec
from infopt.runtime.tasks.base import Samples, Task
from infopt.runtime.tasks.media import processor, wrapper_class

AUDIO_INPUTS = ("input_values", "input_features")
AUDIO_RATE = 16000
AUDIO_SUFFIXES = (".wav",)


def _spec(model, path, config) -> InputSpec:
    if model.main_input_name == "input_features":
        mels, frames = int(config.get("num_mel_bins") or 80), 2 * int(config.get("max_source_positions") or 1500)
        return InputSpec.parse([f"input_features:float32[batch,{mels},{frames}]"])
    spec = InputSpec.parse(["input_values:float32[batch,samples]"])
    return spec.with_dims({"samples": DimRange(AUDIO_RATE, AUDIO_RATE, 4 * AUDIO_RATE)})


def read_wav(path: Path) -> tuple[np.ndarray, int]:
    """A PCM ``.wav`` file as float32 mono in [-1, 1], and its sampling rate."""
    try:
        with wave.open(str(path), "rb") as f:
            width, channels, rate = f.getsampwidth(), f.getnchannels(), f.getframerate()
            raw = f.readframes(f.getnframes())
    except (OSError, EOFError, wave.Error) as exc:
        raise UsageError(f"cannot read {path} as a PCM .wav file: {exc}", where=str(path),
                         fix="pass 8-, 16- or 32-bit PCM .wav files") from exc
    if width not in (1, 2, 4):
        raise UsageError(f"{path} has {8 * width}-bit samples", where=str(path), fix="pass 8-, 16- or 32-bit PCM .wav files")
    dtype = {1: np.uint8, 2: np.int16, 4: np.int32}[width]
    samples = np.frombuffer(raw, dtype=dtype).astype(np.float32)
    samples = (samples - 128.0) / 128.0 if width == 1 else samples / float(2 ** (8 * width - 1))
    return samples.reshape(-1, channels).mean(axis=1), rate


def read_audio(files: list[Path], spec: InputSpec, folder: Path) -> Samples:
    name = spec.names[0]
    extractor = processor(folder, "audio", "feature extractor")
    rate = int(getattr(extractor, "sampling_rate", AUDIO_RATE))
    for path in files:
        samples, got = read_wav(path)
        if got != rate:
            raise UsageError(f"{path} is sampled at {got} Hz; the model's feature extractor takes {rate} Hz",
                             where=str(path), fix=f"resample the file to {rate} Hz")
        features = extractor(samples, sampling_rate=rate, return_tensors="np")
        yield str(path), {name: np.asarray(features[name], dtype=np.float32)}


AUDIO = Task("audio", "cosine", lambda m, p, c: getattr(m, "main_input_name", None) in AUDIO_INPUTS, _spec,
             lambda model, path: wrapper_class()(model, str(path), model.main_input_name), AUDIO_SUFFIXES, read_audio)
