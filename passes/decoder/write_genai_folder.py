"""Write the ONNX Runtime GenAI folder of a KV decoder (``onnx -> onnx``): the decoder as ``model.onnx`` (its
tensors beside it when large), ``genai_config.json`` and the source folder's tokenizer
(``exporters/servers/onnxruntime_genai.py``). The build judges this very folder by generating from it, and the
``onnxruntime-genai`` emitter moves it into the output; the artifact goes on as the folder's model file. The
decoder's tensors' file is moved from the work folder (a model given from elsewhere is copied).
"""

from __future__ import annotations

from pydantic import Field

from infopt.core.artifact import Artifact
from infopt.core.errors import BuildError
from infopt.core.pass_api import Pass, PassContext, PassDetails, PassOptions, PassOutcome
from infopt.core.threads import physical_cores
from infopt.exporters import genai_folder as genai
from infopt.exporters import kv_decoder


class GenaiFolderOptions(PassOptions):
    threads: int | None = Field(None, ge=1, description="the decoder session's intra-op threads written to "
                                                        "genai_config.json (default: this machine's physical cores)")


class GenaiFolderDetails(PassDetails):
    model_type: str
    """genai_config.json's model.type"""
    context_length: int
    threads: int
    share_buffer: bool
    """the KV cache is one buffer each step writes into (every layer's attention fused)"""
    weights_bytes: int
    """the folder's model files, as stored (4-bit, int8 or float weights)"""


def run(artifact: Artifact, options: GenaiFolderOptions, context: PassContext) -> PassOutcome:
    decoder = artifact.products.get(kv_decoder.KvDecoder)
    if decoder is None or decoder.source is None:
        raise BuildError("write_genai_folder needs the decoder captured by capture_kv_decoder from a model folder",
                         fix="build a Hugging Face causal LM's folder with --task text-generation")
    threads = options.threads or physical_cores()
    config = genai.genai_config(decoder.config, decoder.layout, decoder.context, decoder.source, threads=threads,
                                share_buffer=decoder.fused)
    # the decoder's tensors moved out of the pass before's work file (6 GB of float32 at 1.5B, 3-8 s to copy)
    folder = genai.write_folder(context.workdir / "genai", artifact.path, config, decoder.source,
                                move=context.in_work_folder(artifact.path))
    result = artifact.derive("onnx", path=folder / config["model"]["decoder"]["filename"])
    result.products[genai.GenaiFolder] = genai.GenaiFolder(folder)
    notes = [f"the decoder runs {threads} intra-op thread{'s' if threads > 1 else ''} (this machine's physical cores "
             "unless the recipe says; model.decoder.session_options.intra_op_num_threads in genai_config.json) and "
             + ("writes its KV cache into one shared buffer" if decoder.fused else
                "concatenates its KV cache each step (attention not fused)")]
    return PassOutcome(result, True, notes, GenaiFolderDetails(
        model_type=config["model"]["type"], context_length=decoder.context, threads=threads,
        share_buffer=decoder.fused, weights_bytes=genai.weights_bytes(folder)))


PASS = Pass(
    name="write_genai_folder",
    consumes="onnx",
    produces="onnx",
    run=run,
    options=GenaiFolderOptions,
    details=GenaiFolderDetails,
    description="the ONNX Runtime GenAI folder of a KV decoder: model.onnx, genai_config.json, the tokenizer",
)
