"""ONNX Runtime GenAI: ``servers/onnxruntime-genai/`` of a text-generation build, the folder
``onnxruntime_genai.Model`` loads and generates from (``exporters/genai_folder.py`` writes it). The build
validates that very folder by generating from it; this emitter moves it into the output (the build's last use
of it). Serve it with
``onnxruntime_genai`` (Python, C#, C) or ``onnxruntime-genai``'s server examples.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from infopt.exporters.genai_folder import GenaiFolder
from infopt.exporters.servers.emitter import EmitJob, ServerEmitter, register

FOLDER = "servers/onnxruntime-genai"
"""where the folder goes in the output; its model is the output's model (the manifest's ``artifacts.model``)"""


def emit(job: EmitJob) -> Path | None:
    prepared: GenaiFolder | None = job.products.get(GenaiFolder)
    if prepared is None:
        return None
    target = job.stage / FOLDER
    # moved, not copied: the build's judging and timing are done with it, and its model is the output's model
    # (the manifest's ``artifacts.model``: the weights are stored once)
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.move(prepared.path, target)
    return target


SERVES = {"onnx": "the decoder with its KV cache, genai_config.json and the tokenizer (text-generation builds)"}
"""the representations this server serves, and how"""

EMITTER = register(ServerEmitter("onnxruntime-genai", 45, emit, SERVES))
