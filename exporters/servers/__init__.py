"""Server layouts, one module per server, each registering its ``emitter.ServerEmitter``: the Triton
Inference Server model repository, a TorchServe archive, KServe InferenceServices, vLLM's 4-bit
checkpoint. Importing this package registers every emitter in the folder."""

from __future__ import annotations

import importlib
import pkgutil

from infopt.exporters.servers.emitter import EmitJob, ServerEmitter, registered

for _info in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_info.name}")

__all__ = ["EmitJob", "ServerEmitter", "registered"]
