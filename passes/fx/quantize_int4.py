"""INT4 weight-only quantization of the model's Linear layers (RTN, GPTQ or AWQ), before capture.

Works on the ``nn.Module`` (``torch -> torch``) because GPTQ and AWQ calibrate layer by layer with
hooks (``quantize/weight_only.py``). The result holds :class:`Int4Linear` layers, which capture
keeps as one ``infopt.int4_linear`` op each; the ONNX exporter lowers those to ``MatMulNBits``
and the ``int4_kernels`` pass swaps them for the Triton kernel on CUDA.

When the model holds a Hugging Face transformer (a submodule with a ``config``), the pass also
chooses its 4-bit checkpoint for the serving engines, checks that the layout can hold every layer,
and hands the quantized module on (``Artifact.products[CheckpointSource]``); the vLLM emitter
(``exporters/servers/vllm.py``) writes it into ``servers/vllm/`` of the output. The GPTQ layout by
default, or AWQ's GEMM layout (``checkpoint: awq``). After AWQ, whose per-input scales stay in
the model as a division before each layer, no checkpoint is written unless one is asked for, and
asking is an error that names the layer (neither layout holds such a scale).

Calibration samples padded along a ``seq`` dim are batched by length and cut back when the model
takes an ``attention_mask``: padded positions never reach the model's output, and their
activations would otherwise dominate the Hessians and activation statistics.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import Field, field_validator

from infopt.core.artifact import Artifact
from infopt.core.errors import BuildError, UsageError
from infopt.core.pass_api import Pass, PassContext, PassDetails, PassOptions, PassOutcome
from infopt.exporters.int4_checkpoint import CheckpointSource, checkpoint_format
from infopt.passes.fx.int4_eight_bit import choice_note, held_in_int4, int8_plan, mixed_rule
from infopt.passes.fx.int4_sections import int4_sections
from infopt.quantize.int4_config import Int4Config, Int4MethodConfig, Method
from infopt.quantize.int4_fallback import fall_back_to_budget
from infopt.quantize.int4_format import conv1d_as_linear
from infopt.quantize.layer_choice import INT8_BITS, EightBitLayers, checked_cap, stored_bits
from infopt.quantize.method_names import CheckpointLayout
from infopt.quantize.sampled_text import SAMPLED
from infopt.quantize.sensitivity import Budget
from infopt.quantize.weight_only import quantize_int4
from infopt.runtime.backend import package_version

CHECKPOINT_DIR = "servers/vllm"


def _column_order(config) -> str:
    if getattr(config, "act_order", False):
        return ", act-order"
    return ", whole groups by importance" if getattr(config, "group_order", False) else ""


class QuantizeInt4Options(PassOptions, Int4Config):
    SETTINGS: ClassVar[dict[str, str]] = {"method": "int4_method", "group_size": "group_size",
                                          "act_order": "act_order", "checkpoint": "int4_checkpoint",
                                          "max_bits_per_weight": "max_bits_per_weight"}
    method: Literal["auto", Method] = Field(
        "auto", description="auto: GPTQ with calibration data (for text generation, seeded sequences the "
                        "model samples where no --calib is given, up to 250M parameters), else RTN; or rtn, gptq, awq")
    fallback_budget: str | None = Field(
        None, description="drift budget METRIC=VALUE (as --max-drift, which wins) measured on the validation inputs "
                          "after quantizing; the most sensitive layers go back to float until it holds")
    in_place: bool = Field(False, description="round the module's own Linears rather than a copy's, so the build never "
                                              "holds the weights twice; for a build that took its reference before "
                                              "this pass (text generation), and never with a fallback budget")
    calibration_batch: int = Field(16, ge=1, description="calibration samples run together, sorted by length, each "
                                                        "batch cut to its longest and its padding kept out of the "
                                                        "statistics; 1 runs each at its own length")
    int8_share: float | Literal["auto"] = Field(
        0.0, description="the layers adding the most error to their outputs (GPTQ/AWQ on calibration data), up to "
                         "this share of the weights, stay in float for 8 bits downstream; auto: as many as the size "
                         "target holds (max_bits_per_weight, else Q4_K_M's size), judged on text held out of "
                         "calibration (text generation); RTN (no data): llama.cpp's mixed strategy")
    @field_validator("int8_share")
    @classmethod
    def _a_share(cls, value):
        if value != "auto" and not 0 <= value <= 1:
            raise ValueError(f"int8_share {value} is a share of the weights, from 0 to 1, or auto")
        return value

    eight_bit_in_export: bool = Field(
        False, description="the layers kept for 8 bits stay INT4 in the module until onnx_export lowers them to 8 bits "
                           "from their float weights, so a decoder's layers stay alike (one exported, stamped for "
                           "all); else they are float in the module, for a graph pass to round")
    max_bits_per_weight: float | None = Field(
        None, gt=0, description="the size target: the whole model's stored bits per parameter, every table counted "
                                "(for a decoder with an output head; else the INT4 layers' own average); int8_share auto "
                                "keeps as many of the most sensitive layers for 8 bits as it holds. Unset: llama.cpp "
                                "Q4_K_M's size for the model")
    checkpoint: CheckpointLayout = Field(
        "auto", description="4-bit checkpoint for the serving engines when the model has a Hugging Face config; "
                            "auto: GPTQ layout, none after AWQ (its input scales have no place in either layout)")


SKIPPED_ROUTE = "none: no Python module"
"""``Int4Details.route`` when the module pass stepped aside; its method and grid are what was asked,
which the ONNX graph pass follows."""


class Int4Details(PassDetails):
    """What ``quantize_int4`` (and ``quantize_int4_graph``) record: the method, one row per INT4 layer,
    the layers left in float and why, the fallback and the checkpoint."""

    method: str
    group_size: int
    """as asked; a layer it does not divide has its own in its row"""
    symmetric: bool
    act_order: bool = False
    calibration_rows: int = 0
    layers: list[dict[str, Any]] = Field(default_factory=list)
    """name, shape, error (relative output error on calibration data, None without), seconds, alpha,
    act_order, group_size"""
    kept: dict[str, str] = Field(default_factory=dict)
    fallback: dict[str, Any] | None = None
    bits_per_weight: float | None = None
    """the INT4 layers' and those kept for 8 bits' average bits per weight, as stored (codes, scales, zero points)"""
    model_bits: float | None = None
    """the whole model's bits per parameter, every table counted (the head in 8 bits, an untied embedding in 4)"""
    target_bits: float | None = None
    """the size target it was built to: ``--max-bits-per-weight``, else llama.cpp Q4_K_M's size for this model"""
    choice: dict[str, Any] | None = None
    """``int8_share: auto``'s ladder (``layer_choice.LayerChoice.to_json``): each share tried, its figures, the one chosen"""
    checkpoint: dict[str, Any] | None = None
    """format, folder, module: the 4-bit checkpoint the vLLM emitter writes"""
    route: str | None = None
    """"onnx graph" when the graph pass quantized a model with no Python module; :data:`SKIPPED_ROUTE`
    when this pass stepped aside for it"""

    def sections(self) -> list:
        return int4_sections(self)


def argument_tuples(batches, spec) -> list[tuple]:
    """Each batch (name -> array) as a tuple of tensors in argument order, as it is."""
    import numpy as np
    import torch

    return [tuple(torch.from_numpy(np.ascontiguousarray(b[n])) for n in spec.names) for b in batches]


def calibration_batches(calibration, spec, batch_size: int = 16) -> list[tuple]:
    """The calibration set as tuples of tensors in argument order. With an ``attention_mask``
    input, samples are sorted by length and batched, and each batch is cut (or a shorter sample padded
    with zeros, its mask 0) to its longest sample, so few padded positions are left, and
    :func:`calibration_masks` keeps those out of the statistics."""
    import numpy as np
    import torch

    names = spec.names
    if "attention_mask" not in names or not spec.batch_symbol:
        return argument_tuples(calibration, spec)
    seq_axes = {t.name: [i for i, d in enumerate(t.shape) if isinstance(d, str) and d != spec.batch_symbol]
                for t in spec.inputs}
    samples = []
    for batch in calibration:
        for i in range(batch["attention_mask"].shape[0]):
            present = np.nonzero(batch["attention_mask"][i])[0]
            if present.size:
                samples.append((int(present[-1]) + 1, {n: batch[n][i:i + 1] for n in names}))
    samples.sort(key=lambda item: item[0])
    out = []
    for start in range(0, len(samples), batch_size):
        chunk = samples[start:start + batch_size]
        length = chunk[-1][0]
        row = []
        for n in names:
            value = np.concatenate([_fitted(feed[n], seq_axes[n], length) for _, feed in chunk])
            row.append(torch.from_numpy(np.ascontiguousarray(value)))
        out.append(tuple(row))
    return out


def _fitted(value, axes: list[int], length: int):
    """``value`` cut or padded with zeros to ``length`` along each of ``axes``."""
    import numpy as np

    for axis in axes:
        if value.shape[axis] >= length:
            value = np.take(value, np.arange(length), axis=axis)
        else:
            pad = [(0, 0)] * value.ndim
            pad[axis] = (0, length - value.shape[axis])
            value = np.pad(value, pad)
    return value


def calibration_masks(batches: list[tuple], spec) -> list | None:
    """Each batch's real positions (its ``attention_mask`` as booleans), for the statistics; None without one."""
    if "attention_mask" not in spec.names:
        return None
    index = spec.names.index("attention_mask")
    return [b[index].bool() if b[index].dim() == 2 else None for b in batches]


GRAPH_PASS = "quantize_int4_graph"


def hf_model(module):
    """The Hugging Face model inside ``module`` (a submodule whose ``config`` has ``to_dict``), or None."""
    for name, sub in module.named_modules():
        if hasattr(getattr(sub, "config", None), "to_dict"):
            return name, sub
    return None


def run(artifact: Artifact, options: QuantizeInt4Options, context: PassContext) -> PassOutcome:

    module = artifact.obj
    method = options.method
    if method == "auto":
        method = "gptq" if context.calibration is not None else "rtn"
    config = _method_config(options, method)
    if not artifact.has_python_module:
        note = (f"skipped: a TorchScript model has no Python module to quantize layer by layer; "
                f"{GRAPH_PASS} quantizes its ONNX graph (RTN) instead")
        asked = Int4Details(method=options.method, group_size=options.group_size, symmetric=options.symmetric,
                            route=SKIPPED_ROUTE)
        return PassOutcome(artifact, False, [note], asked)
    batches = (calibration_batches(context.calibration, artifact.spec, options.calibration_batch)
               if config.needs_data and context.calibration else None)
    if options.in_place and (context.budget or options.fallback_budget):
        raise BuildError("quantize_int4 in place cannot fall back to float layers: their float weights are gone",
                         fix="drop in_place from the recipe's quantize_int4 options, or the fallback budget")
    model = module.eval() if options.in_place else copy.deepcopy(module).eval()
    conv1d = conv1d_as_linear(model)  # GPT-2's Conv1D projections are Linears with the weight transposed
    # a checkpoint's config holds one group size: decided before calibrating, for every layer
    checkpoint = options.checkpoint in ("gptq", "awq") or (options.checkpoint == "auto" and not config.input_scales
                                                           and not conv1d)
    uniform = checkpoint and hf_model(model) is not None
    planned = int8_plan(model, config, options, context, uniform)
    share, chooser, int4_bits = planned.share, planned.chooser, planned.int4_bits
    rule = mixed_rule(model, config, options, uniform, planned)
    result = quantize_int4(model, config, batches, progress=context.say, uniform_group_size=uniform,
                           masks=calibration_masks(batches, artifact.spec) if batches else None,
                           int8_share=share, choose=chooser, for_8bit=rule, fold_scales=options.in_place)
    fallback = None if options.in_place else _fall_back(module, model, result, options, context, artifact.spec)
    eight_bit = held_in_int4(model, result) if options.eight_bit_in_export else None
    layers = [row.to_json() for row in result.layers]
    errors = [row["error"] for row in layers if row["error"] is not None]
    sizes = sorted({row["group_size"] for row in layers}, reverse=True)
    grid = f"group size {'/'.join(map(str, sizes)) or config.group_size}, {'symmetric' if config.symmetric else 'asymmetric'}"
    notes = [f"{len(layers)} Linear layers to INT4 with {method.upper()} ({grid}"
             + _column_order(config) + ")"]
    restored = set(fallback["restored"]) if fallback else set()
    for_8bit = result.for_8bit
    notes += [f"kept {name} in float: {why}" for name, why in result.kept.items()
              if name not in restored and name not in for_8bit]
    if rule:
        notes.append(f"{len(rule)} layers kept for 8 bits with no data to choose on: llama.cpp's mixed strategy, the "
                     "attention's query/key/value and the MLP's down projection of the first and last eighth of the "
                     "blocks and every third between (int8_share auto; --calib chooses by accuracy)")
    elif for_8bit and chooser is None:
        notes.append(f"{len(for_8bit)} layers kept for 8 bits (int8_share {share:g}): those adding the "
                     f"most error to their outputs on the calibration data (the INT4 layers table names them)")
    if chooser is not None:
        notes.append(choice_note(chooser, len(for_8bit), planned.target))
    smaller = [row["name"] for row in layers if row["group_size"] != config.group_size]
    if smaller and uniform and len(sizes) == 1:
        notes.append(f"group size {sizes[0]} for every layer: {config.group_size} does not divide the input features "
                     f"of {len(smaller)} of them, and the 4-bit checkpoint's config holds one group size")
    elif smaller:
        notes.append(f"group size below {config.group_size} where {config.group_size} does not divide the input "
                     f"features: {', '.join(smaller)}")
    if not layers:
        notes.append("no layer was quantized: this artifact computes in float")
    if fallback and fallback["restored"]:
        before, after = fallback["before"], fallback["after"]
        metric = fallback["budget"].split()[0]
        notes.append(f"{len(fallback['restored'])} most sensitive layer(s) back in float to hold {fallback['budget']}: "
                     f"{metric} {before.get(metric):.4g} -> {after.get(metric):.4g} (the INT4 layers table names them)")
    if result.folded:
        scaled = sum(1 for w in result.weights.values() if w.input_scale is not None)
        notes.append(f"{len(result.folded)} layers' AWQ input scales folded into the norm before them (no division "
                     f"left there); {scaled} layers still divide their input by theirs")
    if conv1d:
        notes.append(f"{len(conv1d)} transformers Conv1D layers quantized as the Linears they are (weight transposed)")
    if options.method == "auto" and method == "rtn":
        notes.append("no calibration data: round-to-nearest; pass --calib for GPTQ")
    if context.calibration is not None and SAMPLED in context.calibration.source and config.needs_data:
        notes.append(f"no --calib: {method.upper()} on {context.calibration.source.removesuffix(' (no --calib)')}; "
                     "--calib with text like what the model will serve calibrates closer to it")
    if errors:
        notes.append(f"relative output error per layer on calibration data: mean {sum(errors) / len(errors):.2e}, "
                     f"worst {max(errors):.2e}")
    eight = sum(result.spare[n].out_features * result.spare[n].in_features for n in for_8bit)
    four = sum(w.out_features * w.in_features for w in result.weights.values())
    bits = round((int4_bits * four + INT8_BITS * eight) / (four + eight), 3) if four + eight else None
    if bits is not None:
        notes.append(f"{bits:g} bits per weight over the quantized layers (INT4 {int4_bits:.3f} as stored, 8-bit "
                     f"{INT8_BITS:g})" + ("" if planned.target is None else
                                         f"; {planned.target.whole(bits):.3f} bits per parameter over every table, the "
                                         f"head in 8 bits and an untied embedding in 4, against a target of "
                                         f"{planned.target.text()}"))
    details = Int4Details(method=method, group_size=config.group_size, symmetric=config.symmetric,
                          act_order=getattr(config, "act_order", False), calibration_rows=result.rows, layers=layers,
                          kept=result.kept, fallback=fallback, bits_per_weight=bits,
                          model_bits=None if planned.target is None or bits is None else
                          round(planned.target.whole(bits), 3),
                          target_bits=None if planned.target is None else round(planned.target.target, 3),
                          choice=chooser.to_json() if chooser is not None and chooser.chosen else None)
    result_artifact = artifact.derive("torch", obj=model)
    if eight_bit is not None:
        result_artifact.products[EightBitLayers] = eight_bit
    layout = options.checkpoint
    if layout == "auto" and conv1d:
        layout = "none"
        transformers = package_version("transformers") or "not installed"
        notes.append(f"no 4-bit checkpoint: transformers ({transformers}) does not load a GPTQ checkpoint "
                     "of a model with Conv1D layers (GPT-2's weight initialisation reads c_proj.weight, which a "
                     "quantized layer does not have); --int4-checkpoint gptq writes one anyway")
    if layout == "auto":
        layout = "none" if any(w.input_scale is not None for w in result.weights.values()) else "gptq"
        if layout == "none":
            notes.append("no 4-bit checkpoint: AWQ's per-input scales are kept in the model (a Mul before each "
                         "layer), and the GPTQ and AWQ checkpoint layouts have no place for them")
    if layout != "none" and layers:
        notes.append(_plan_checkpoint(model, layout, result_artifact, details))
    return PassOutcome(result_artifact, True, notes, details)


def _method_config(options: QuantizeInt4Options, method: str) -> Int4MethodConfig:
    """The chosen method's config from the options given (a setting of another method is refused)."""
    given = options.model_dump(exclude={"method", "checkpoint", "fallback_budget", "calibration_batch", "in_place",
                                        "int8_share", "max_bits_per_weight", "eight_bit_in_export"},
                                exclude_unset=True)
    try:
        return Int4Config(method=method, **given).method_config()
    except UsageError as exc:
        if options.method == "auto":
            exc.fix = f"{exc.fix}; auto chose {method.upper()} because " + (
                "there is no calibration data (pass --calib for GPTQ)" if method == "rtn" else "there is calibration data")
        raise


def _fall_back(original, quantized, result, options: QuantizeInt4Options, context: PassContext, spec):
    """The sensitivity fallback under the user's --max-drift or the recipe's budget, on the inputs the
    build validates with; None when there is no budget or nothing to measure on."""

    budget = context.budget or (Budget.parse(options.fallback_budget) if options.fallback_budget else None)
    if budget is None or not context.check_batches:
        return None
    # the validation batches as they are (not cut back by length like calibration batches): the
    # outputs of every batch then have the same shape and are compared as the verdict compares them
    batches = argument_tuples(context.check_batches, spec)
    return fall_back_to_budget(original.eval(), quantized, result, batches, budget, progress=context.say)


def _plan_checkpoint(model, layout: str, artifact: Artifact, details: Int4Details) -> str:
    found = hf_model(model)
    if found is None:
        return "no Hugging Face config in the model, so no 4-bit checkpoint for vLLM"
    prefix, inner = found
    fmt = checkpoint_format(inner, layout)
    source = getattr(model, "source_dir", None)
    artifact.products[CheckpointSource] = CheckpointSource(inner, fmt, Path(source) if source else None)
    details.checkpoint = {"format": fmt, "folder": CHECKPOINT_DIR, "module": prefix or "(the model)"}
    return f"{fmt.upper()} checkpoint of {prefix or 'the model'} for {CHECKPOINT_DIR}/ (vLLM, transformers)"


def check(options: QuantizeInt4Options, _target, _has_calibration: bool) -> None:
    """A cap below the INT4 grid's own bits at the group size asked, refused before the model loads (the layers'
    own group sizes, known once it has, are checked again by the run)."""
    checked_cap(options.max_bits_per_weight, stored_bits(4, options.group_size, options.symmetric))


PASS = Pass(
    name="quantize_int4",
    consumes="torch",
    produces="torch",
    run=run,
    options=QuantizeInt4Options,
    details=Int4Details,
    check=check,
    description="INT4 weight-only Linear layers (RTN, GPTQ, AWQ) in infopt's packed format; GPTQ/AWQ checkpoint",
    needs_python_module="INT4 quantizes layer by layer, and TorchScript, .pt2 and ONNX have no Python layers; "
                        "the onnxruntime backend quantizes the graph instead",
)
