"""Lower an ExportedProgram to ONNX with the dynamo exporter.

The saved model passes ``onnx.checker`` and carries inferred shapes. Dynamic dims are named
after the InputSpec's symbols (``batch``, ``seq``), so servers and later passes see the same
names the user gave.

An export is kept in infopt's cache folder (``onnx-export/``) under the hash of everything it
depends on (:func:`export_key`), so a rebuild of the same program (another precision or backend of
the same model, the same build again) copies the file a fresh export would write instead of
exporting again; ``cache: false`` turns that off.
"""

from __future__ import annotations

import shutil
import sys
import time
from pathlib import Path
from typing import NamedTuple

from pydantic import Field

from infopt.core.artifact import Artifact
from infopt.core.cache import content_key, store, stored
from infopt.core.errors import BuildError, CaptureError
from infopt.core.logs import quiet_third_party
from infopt.core.manifest import EXTERNAL_DATA_BYTES
from infopt.core.onnx_graph import save_ir_beside
from infopt.core.pass_api import Pass, PassContext, PassDetails, PassOptions, PassOutcome
from infopt.exporters import kv_attention
from infopt.exporters.layer_probe import PROBE_LAYERS, LayerStamp
from infopt.exporters.program_key import key_or_none, program_parts, source_of
from infopt.passes.lower import onnx_stamp
from infopt.passes.lower.onnx_int4 import lower_int4_nodes, translation_table
from infopt.quantize.layer_choice import EIGHT_BIT_BLOCK, EightBitLayers


class OnnxExportOptions(PassOptions):
    opset: int = Field(20, ge=17, le=23, description="ONNX opset version to emit (20 has Gelu, which ONNX Runtime fuses)")
    optimize: bool = Field(True, description="run the exporter's own graph optimizer (constant folding, CSE)")
    int4_accuracy_level: int = Field(0, ge=0, le=4, description="MatMulNBits accuracy_level for INT4 layers: 0 computes "
                                     "in the input's float type; 4 lets ONNX Runtime quantize activations to int8 per block "
                                     "(faster on CPU, less exact)")
    cache: bool = Field(True, description="reuse an identical export from infopt's cache folder (keyed by the program, "
                                          "its weights, these options and the exporter's versions)")


class Exported(NamedTuple):
    """What :func:`export_onnx` made besides the file."""

    matmul_nbits: int
    """MatMulNBits nodes (INT4 layers) emitted"""
    packed: int = 0
    """groups of sibling projections packed into one MatMul as a stamped decoder was written"""
    eight_bit: int = 0
    """of ``matmul_nbits``, those lowered to 8 bits (``EightBitLayers``)"""


def export_onnx(program, path: Path, input_names, output_names, opset: int = 20, optimize: bool = True,
                int4_accuracy_level: int = 0, stamp: LayerStamp | None = None,
                eight_bit: EightBitLayers | None = None) -> Exported:
    """Export, save, check and infer shapes.

    Exporter chatter is kept off the user's terminal. infopt's own ops are translated by the
    ``custom_translation_table``: the INT4 layer, and a KV decoder's fused attention. With ``stamp``, the
    program is a decoder's probe and its second layer is stamped for the rest (``onnx_stamp.py``). With
    ``eight_bit``, the INT4 layers it names are lowered to 8 bits from their float weights.
    """
    import onnx
    import torch

    with quiet_third_party():
        onnx_program = torch.onnx.export(program, (), dynamo=True, input_names=list(input_names),
                                         output_names=list(output_names), opset_version=opset,
                                         optimize=optimize and stamp is None, verbose=False,
                                         custom_translation_table={**translation_table(), **kv_attention.translation_table()})
        big = sum(t.numel() * t.element_size() for t in program.state_dict.values()) > EXTERNAL_DATA_BYTES
        packed = 0
        if stamp is not None:
            big = big or stamp.layers > PROBE_LAYERS
            graph = onnx_program.model.graph
            tensors = onnx_stamp.hide_weights(graph, {*program.state_dict, *(
                name for name in program.constants if name.startswith(f"lm.{stamp.path}."))})
            if optimize:
                onnx_program.optimize()
            onnx_stamp.stamp(onnx_program.model.graph, stamp, tensors)
            packed = onnx_stamp.restore_weights(onnx_program.model, tensors)
        matmul_nbits, eights = lower_int4_nodes(onnx_program.model, int4_accuracy_level, eight_bit)
        if big:
            save_ir_beside(onnx_program.model, path)
        else:
            onnx_program.save(str(path))
    try:
        onnx.checker.check_model(str(path), full_check=True)
        onnx.shape_inference.infer_shapes_path(str(path), str(path))
    except Exception as exc:  # noqa: BLE001 - checker raises several types
        raise BuildError(f"the exported ONNX model fails onnx.checker: {str(exc).splitlines()[0]}",
                         where=str(path), fix="report the model; try --recipe with another opset") from exc
    return Exported(matmul_nbits, packed, eights)


def rename_dims(path: Path, spec) -> dict[str, str]:
    """Rename the exporter's dim symbols (``s77``) to the InputSpec's (``batch``) in place."""
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    mapping: dict[str, str] = {}
    by_name = {t.name: t for t in spec.inputs}
    for value in model.graph.input:
        tensor = by_name.get(value.name)
        if tensor is None:
            continue
        for dim, want in zip(value.type.tensor_type.shape.dim, tensor.shape):
            if dim.dim_param and isinstance(want, str):
                mapping[dim.dim_param] = want
    if mapping:
        for value in [*model.graph.input, *model.graph.output, *model.graph.value_info]:
            for dim in value.type.tensor_type.shape.dim:
                if dim.dim_param in mapping:
                    dim.dim_param = mapping[dim.dim_param]
        onnx.save(model, str(path))
    return mapping


def run(artifact: Artifact, options: OnnxExportOptions, context: PassContext) -> PassOutcome:
    import onnx

    path = context.workdir / "exported.onnx"
    stamp = artifact.products.get(LayerStamp)
    stamp_failed = None
    if stamp is not None:
        try:
            return _stamped(artifact, stamp, path, options, context)
        except CaptureError as exc:  # the probe's layers did not match: the decoder captured whole after all
            stamp_failed = f"not stamped ({exc.what}): the decoder captured and exported whole"
            context.say(stamp_failed)
            artifact = artifact.derive("exported", obj=stamp.recapture())
            del artifact.products[LayerStamp]
    eight_bit = artifact.products.get(EightBitLayers)
    # the layers lowered to 8 bits come from weights the program does not hold: such an export is not cached
    key = key_or_none(lambda: export_key(artifact.obj, artifact.spec.names, artifact.output_names, options,
                                         artifact.spec)) if options.cache and eight_bit is None else None
    hit = stored(STORE, key) if key else None
    if hit is not None:
        folder, meta = hit
        for rel in meta["files"]:
            shutil.copyfile(folder / rel, context.workdir / rel)
        details = ExportDetails.model_validate({**meta["details"], "cached": True})
        return PassOutcome(artifact.derive("onnx", path=path, obj=None), True, list(meta["notes"]), details)
    began = time.perf_counter()
    exported = export_onnx(artifact.obj, path, artifact.spec.names, artifact.output_names, options.opset,
                           options.optimize, options.int4_accuracy_level, eight_bit=eight_bit)
    renamed = rename_dims(path, artifact.spec)
    model = onnx.load(str(path), load_external_data=False)
    notes = [f"opset {options.opset}, {len(model.graph.node)} nodes", *([stamp_failed] if stamp_failed else [])]
    details = ExportDetails(seconds=round(time.perf_counter() - began, 2))
    _nbits_notes(exported, options, notes, details)
    result = artifact.derive("onnx", path=path, obj=None)
    _eight_bit_done(result)
    if renamed:
        notes.append(dims_note(renamed))
    if key:
        store(STORE, key, {f.name: f for f in context.workdir.glob(f"{path.name}*")},
              {"notes": notes, "details": details.model_dump(exclude_none=True)})
    return PassOutcome(result, True, notes, details)


def dims_note(renamed: dict[str, str]) -> str:
    """The exporter's dim symbols renamed, in words: each one where few are, else the names and how many."""
    if len(renamed) <= 6:
        return "dims named " + ", ".join(f"{a}->{b}" for a, b in renamed.items())
    return (f"{len(renamed)} dim symbols of the exporter named " + ", ".join(dict.fromkeys(renamed.values())))


def _nbits_notes(exported: Exported, options: OnnxExportOptions, notes: list[str], details: "ExportDetails") -> None:
    if exported.matmul_nbits:
        four = exported.matmul_nbits - exported.eight_bit
        notes.append(f"{four} INT4 layers as MatMulNBits (accuracy_level {options.int4_accuracy_level})"
                     + (f"; {exported.eight_bit} layers kept for 8 bits lowered from their float weights to 8-bit "
                        f"MatMulNBits (block {EIGHT_BIT_BLOCK}, accuracy_level 4) in their INT4 layers' place"
                        if exported.eight_bit else ""))
        details.matmul_nbits = exported.matmul_nbits
        details.eight_bit = exported.eight_bit or None


def _eight_bit_done(result: Artifact) -> None:
    """The layers kept for 8 bits, now lowered, back in float in the module (its 4-bit checkpoint lists them
    unquantized); the product dropped."""
    eight_bit = result.products.pop(EightBitLayers, None)
    if eight_bit is not None:
        eight_bit.restore()


def _stamped(artifact: Artifact, stamp: LayerStamp, path: Path, options: OnnxExportOptions,
             context: PassContext) -> PassOutcome:
    """A decoder's probe exported and stamped to every layer. Not cached: the key would have to hash every
    layer's weights, and the export costs about what copying it would."""
    import onnx

    context.say(f"exporting the decoder's first {PROBE_LAYERS} layers to ONNX and stamping them for {stamp.layers}")
    exported = export_onnx(artifact.obj, path, stamp.input_names, stamp.output_names, options.opset,
                           options.optimize, options.int4_accuracy_level, stamp, artifact.products.get(EightBitLayers))
    renamed = rename_dims(path, artifact.spec)
    model = onnx.load(str(path), load_external_data=False)
    notes = [f"opset {options.opset}, {len(model.graph.node)} nodes: the first {PROBE_LAYERS} layers exported, "
             f"the second stamped for the other {stamp.layers - PROBE_LAYERS}"]
    if exported.packed:
        notes.append(f"sibling projections (query/key/value, gate/up) packed into one MatMul each as written "
                     f"x{exported.packed}")
    details = ExportDetails(stamped_layers=stamp.layers - PROBE_LAYERS, packed=exported.packed or None)
    _nbits_notes(exported, options, notes, details)
    if renamed:
        notes.append(dims_note(renamed))
    result = artifact.derive("onnx", path=path, obj=None)
    del result.products[LayerStamp]
    _eight_bit_done(result)
    return PassOutcome(result, True, notes, details)


STORE = "onnx-export"


def export_key(program, input_names, output_names, options: OnnxExportOptions, spec) -> str:
    """What an export's result depends on, hashed: the program (``exporters/program_key.py``), the
    names, the options, the dims' names, and the versions of the exporter's code and of this module
    and its INT4 lowering, so that a rebuild of the same program gets the file a fresh export writes."""
    import onnx
    import onnxscript
    import torch

    return content_key(*program_parts(program), repr(list(input_names)), repr(list(output_names)),
                       options.model_dump_json(), repr(spec.to_json()),
                       source_of(sys.modules[__name__], sys.modules[lower_int4_nodes.__module__], kv_attention),
                       f"torch {torch.__version__} onnx {onnx.__version__} onnxscript {onnxscript.__version__}")


class ExportDetails(PassDetails):
    """What ``onnx_export`` records: the INT4 layers exported as MatMulNBits, when there are any."""

    matmul_nbits: int | None = None
    eight_bit: int | None = None
    """of ``matmul_nbits``, the layers kept for 8 bits, lowered to 8-bit MatMulNBits"""
    packed: int | None = None
    """groups of sibling projections packed into one MatMul as the stamped decoder was written (``onnx_pack.py``)"""
    stamped_layers: int | None = None
    """the decoder's layers stamped from its second (``capture_kv_decoder``'s probe) rather than exported"""
    cached: bool | None = None
    """True when the file is an earlier build's identical export, from the cache (volatile: it says what the
    cache held, not what the model is; the file is the one a fresh export writes)"""
    seconds: float | None = None
    """what the export took where it ran; from the cache, what it took in the build that stored it (volatile): the
    roof probe counts it, so a rebuild decides on the other candidates as the first build did"""


PASS = Pass(
    name="onnx_export",
    consumes="exported",
    produces="onnx",
    run=run,
    details=ExportDetails,
    options=OnnxExportOptions,
    description="export to ONNX with the dynamo exporter; onnx.checker and shape inference",
)
