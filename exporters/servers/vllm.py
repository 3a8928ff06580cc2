"""vLLM: the 4-bit Hugging Face checkpoint of an INT4 build, ``servers/vllm/``.

vLLM (and transformers) load a GPTQ or AWQ checkpoint folder, not infopt's model file, so this
emitter writes the one the ``quantize_int4`` pass chose and checked
(``Artifact.products[CheckpointSource]``, layouts in ``exporters/int4_checkpoint.py``). A build
without one (no INT4, no Hugging Face config, AWQ with unfolded input scales) gets no folder. Serve
it with ``vllm serve dist/<name>/servers/vllm``; vLLM reads the method from the folder's
``quantization_config``.
"""

from __future__ import annotations

from pathlib import Path

from infopt.exporters.int4_checkpoint import CheckpointSource
from infopt.exporters.servers.emitter import EmitJob, ServerEmitter, register


def emit(job: EmitJob) -> Path | None:
    source: CheckpointSource | None = job.products.get(CheckpointSource)
    if source is None:
        return None
    return source.write(job.stage / "servers" / "vllm")


SERVES = {
    representation: "the 4-bit checkpoint written beside the model (vLLM loads its own format, not the model file)"
    for representation in ("onnx", "aoti", "tensorrt")
}
"""the representations this server serves, and how"""

EMITTER = register(ServerEmitter("vllm", 40, emit, SERVES))
