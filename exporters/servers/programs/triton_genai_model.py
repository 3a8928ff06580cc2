"""Triton Python-backend model: a text-generation build's ONNX Runtime GenAI folder, generating with
``onnxruntime_genai``, decoupled so that each new token can be sent as it comes.

Inputs (what Triton's generate endpoint maps a JSON request's fields to): ``text_input`` (the prompt), and
optionally ``max_tokens`` (new tokens at most, default 64), ``min_tokens`` (new tokens at least, default 0) and
``stream`` (true: one response per new token, for ``/generate_stream``; false or absent: one response with the
whole text, for ``/generate``). Outputs: ``text_output`` (the new text) and ``output_ids`` (the new token ids).
Search is the folder's ``genai_config.json``'s (greedy, as the build validated it).

The folder is the one beside this file (``genai/``) where there is one, else the ``genai_folder`` parameter of
the model's config, relative to this file (infopt writes ``../../../onnxruntime-genai``: the output folder's
``servers/onnxruntime-genai/``, so the weights are not stored twice). Copy the GenAI folder to ``1/genai/`` to
move the repository on its own.

``generate`` holds the generation logic and needs only ``onnxruntime_genai`` and numpy;
``TritonPythonModel`` adapts it to Triton's decoupled requests and responses.
"""

import json
import os
from pathlib import Path

import numpy as np

DEFAULT_MAX_TOKENS = 64


def generate(og, model, tokenizer, context, prompt, max_tokens=DEFAULT_MAX_TOKENS, min_tokens=0):
    """Yield ``(token id, text piece)`` for each new token of the greedy continuation of ``prompt``, at most
    ``context`` tokens in all."""
    ids = np.asarray(tokenizer.encode(prompt), dtype=np.int32)
    if len(ids) >= context:
        raise ValueError(f"the prompt is {len(ids)} tokens long; the model's context holds {context}")
    limit = min(len(ids) + max(1, int(max_tokens)), context)
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=limit, min_length=min(len(ids) + max(0, int(min_tokens)), limit))
    generator = og.Generator(model, params)
    generator.append_tokens(ids.reshape(1, -1))
    stream = tokenizer.create_stream()
    while not generator.is_done():
        generator.generate_next_token()
        token = int(generator.get_next_tokens()[0])
        yield token, stream.decode(token)


def open_folder(og, folder):
    """The folder's model, its tokenizer and its context length."""
    model = og.Model(str(folder))
    context = int(json.loads((Path(folder) / "genai_config.json").read_text())["model"]["context_length"])
    return model, og.Tokenizer(model), context


def folder_for(here, config):
    """The GenAI folder this model serves: ``genai/`` beside ``here``, else the config's ``genai_folder``."""
    beside = Path(here).parent / "genai"
    if (beside / "genai_config.json").is_file():
        return beside
    named = config.get("parameters", {}).get("genai_folder", {}).get("string_value")
    if not named:
        raise RuntimeError(f"no GenAI folder: put it at {beside}, or name it in the config's genai_folder parameter")
    folder = (Path(here).parent / named).resolve()
    if not (folder / "genai_config.json").is_file():
        raise RuntimeError(f"the genai_folder parameter names {folder}, which holds no genai_config.json; copy the "
                           f"build's servers/onnxruntime-genai/ to {beside}")
    return folder


def check_numpy(version=None, allowed=None):
    """Raise where NumPy is 2 or later and ``INFOPT_TRITON_NUMPY2`` is not 1: the backend would serve empty
    tensors (Triton 2.51 and 2.52 list NumPy 2 as unsupported by the Python backend)."""
    version = np.__version__ if version is None else version
    allowed = os.environ.get("INFOPT_TRITON_NUMPY2") == "1" if allowed is None else allowed
    if int(version.split(".")[0]) >= 2 and not allowed:
        raise RuntimeError(f"NumPy {version} in the Python environment Triton runs this model in: Triton's Python "
                           "backend passes tensors through NumPy 1.x. Install numpy<2 in that environment (set "
                           "INFOPT_TRITON_NUMPY2=1 where the Triton in use supports NumPy 2)")


def _scalar(request, name, default):
    import triton_python_backend_utils as pb_utils

    tensor = pb_utils.get_input_tensor_by_name(request, name)
    if tensor is None:
        return default
    value = tensor.as_numpy().reshape(-1)[0]
    return value.decode() if isinstance(value, bytes) else value.item() if hasattr(value, "item") else value


class TritonPythonModel:
    def initialize(self, args):
        import onnxruntime_genai as og

        check_numpy()
        self.og = og
        self.model, self.tokenizer, self.context = open_folder(og, folder_for(__file__, json.loads(args["model_config"])))

    def execute(self, requests):
        import triton_python_backend_utils as pb_utils

        for request in requests:
            sender = request.get_response_sender()
            try:
                prompt = _scalar(request, "text_input", "")
                stream = bool(_scalar(request, "stream", False))
                ids, text = [], []
                for token, piece in generate(self.og, self.model, self.tokenizer, self.context, prompt,
                                             _scalar(request, "max_tokens", DEFAULT_MAX_TOKENS),
                                             _scalar(request, "min_tokens", 0)):
                    ids.append(token)
                    text.append(piece)
                    if stream:
                        sender.send(_response(pb_utils, piece, [token]))
                if not stream:
                    sender.send(_response(pb_utils, "".join(text), ids))
                sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            except Exception as exc:  # one bad request must not take the model down
                sender.send(pb_utils.InferenceResponse(output_tensors=[], error=pb_utils.TritonError(str(exc))),
                            flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None


def _response(pb_utils, text, ids):
    return pb_utils.InferenceResponse(output_tensors=[
        pb_utils.Tensor("text_output", np.asarray([text.encode("utf-8")], dtype=np.object_)),
        pb_utils.Tensor("output_ids", np.asarray(ids, dtype=np.int32))])
