"""Triton's model for a text-generation build: the Python backend generating with ``onnxruntime_genai`` from
the build's GenAI folder, decoupled, so that Triton's generate endpoint answers a prompt
(``POST /v2/models/<name>/generate``, one response) or streams its tokens (``/generate_stream``, Server-Sent
Events, with ``"stream": true``).

``servers/triton/<name>/config.pbtxt`` and ``1/model.py`` (``programs/triton_genai_model.py``); the model reads
the output's ``servers/onnxruntime-genai/`` through the ``genai_folder`` parameter, so the weights are stored
once. The Python environment Triton runs the model in needs ``onnxruntime-genai``.
"""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

GENAI_MODEL = (files("infopt.exporters.servers") / "programs" / "triton_genai_model.py").read_text()
"""The program shipped as ``1/model.py``, kept as a real file so it is linted and tested."""
GENAI_FOLDER = "../../../onnxruntime-genai"
"""where ``1/model.py`` finds the GenAI folder: ``servers/onnxruntime-genai/`` of the same output"""


def config_pbtxt(name: str) -> str:
    """The decoupled Python-backend model's config: the generate endpoint's fields as its inputs and outputs."""
    return f'''name: "{name}"
backend: "python"
max_batch_size: 0
model_transaction_policy {{ decoupled: true }}
input [
  {{ name: "text_input" data_type: TYPE_STRING dims: [ 1 ] }},
  {{ name: "max_tokens" data_type: TYPE_INT32 dims: [ 1 ] optional: true }},
  {{ name: "min_tokens" data_type: TYPE_INT32 dims: [ 1 ] optional: true }},
  {{ name: "stream" data_type: TYPE_BOOL dims: [ 1 ] optional: true }}
]
output [
  {{ name: "text_output" data_type: TYPE_STRING dims: [ 1 ] }},
  {{ name: "output_ids" data_type: TYPE_INT32 dims: [ -1 ] }}
]
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
parameters {{ key: "genai_folder" value: {{ string_value: "{GENAI_FOLDER}" }} }}
'''


def write_generation_model(root: Path, name: str) -> Path:
    """``root/<name>/config.pbtxt`` and ``root/<name>/1/model.py``; returns the model folder."""
    folder = root / name
    (folder / "1").mkdir(parents=True, exist_ok=True)
    (folder / "1" / "model.py").write_text(GENAI_MODEL)
    (folder / "config.pbtxt").write_text(config_pbtxt(name))
    return folder
