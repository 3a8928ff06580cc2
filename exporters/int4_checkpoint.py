"""GPTQ and AWQ checkpoint folders from a model holding :class:`~infopt.quantize.int4_format.Int4Linear` layers.

Each folder is what vLLM and transformers load as is: ``config.json`` (the model's config plus a
``quantization_config``), one ``model.safetensors``, and the tokenizer and generation files copied
from ``source_dir`` when given. Every tensor that is not a quantized Linear's keeps its name and is
written in fp16 when it is floating point. Codes ``c``, zeros ``z`` and scales ``s`` are repacked
from infopt's layout (``quantize/int4_format.py``) without requantizing, so the weight a loader
rebuilds is ``(c - z) * s`` exactly, with ``s`` rounded to fp16.

**GPTQ** (``quant_method: "gptq"``), for a Linear at path ``P`` with ``N`` outputs, ``K`` inputs,
group size ``g``; layout of AutoGPTQ's and GPTQModel's ``QuantLinear.pack`` and of vLLM's
``GPTQLinearMethod.create_weights`` (``vllm/model_executor/layers/quantization/gptq.py``):

- ``P.qweight`` int32 ``[K / 8, N]``: code ``(n, k)`` at bits ``4 * (k % 8)`` of word ``[k // 8, n]``
- ``P.qzeros`` int32 ``[K / g, N / 8]``: zero of ``(group, n)`` at bits ``4 * (n % 8)`` of word
  ``[group, n // 8]``
- ``P.scales`` fp16 ``[K / g, N]``: ``s[group, n]``
- ``P.g_idx`` int32 ``[K]``: the group of input ``k`` (``k // g`` without act-order)
- ``P.bias`` fp16 ``[N]``, when the layer has one

``checkpoint_format: "gptq"`` (v1, what GPTQModel writes by default and every GPTQ loader reads)
stores each zero minus one: vLLM's ``gptq_gemm`` adds 1 to each unpacked nibble unless
``checkpoint_format == "gptq_v2"``, and GPTQModel's ``convert_gptq_v1_to_v2_format_module``
adds ``0x11111111`` to each qzeros word on load. A zero of 0 therefore has no v1 encoding; a
group whose codes stay below 15 is shifted to codes ``c + 1`` with zero 1 (the same weights), and
any other is refused with the advice to write ``checkpoint_format="gptq_v2"`` (zeros stored as
they are, read by vLLM and GPTQModel). ``sym`` is true only when every zero is 8, because vLLM's
Marlin kernel then ignores ``qzeros`` and assumes 8; ``desc_act`` is true when any layer has a
``g_idx`` that is not ``k // g`` (without it vLLM discards ``g_idx``).
``block_name_to_quantize`` and ``modules_in_block_to_quantize`` name exactly the quantized
layers, so optimum (transformers' GPTQ path) converts those and no others, and vLLM's
``is_layer_gptq_quantized`` agrees.

**AWQ GEMM** (``quant_method: "awq"``, ``version: "gemm"``); layout of AutoAWQ's
``WQLinear_GEMM.from_linear`` (also ``gptqmodel/nn_modules/qlinear/gemm_awq.py``) and vLLM's
``AWQLinearMethod`` (``quantization/awq.py``):

- ``P.qweight`` int32 ``[K, N / 8]``: nibble ``i`` (bits ``4i``) of word ``[k, j]`` holds code
  ``(8j + ORDER[i], k)``
- ``P.qzeros`` int32 ``[K / g, N / 8]``: nibble ``i`` of word ``[group, j]`` holds the zero of output
  ``8j + ORDER[i]``, stored as is
- ``P.scales`` fp16 ``[K / g, N]``: ``s[group, n]``
- ``P.bias`` fp16 ``[N]``, when the layer has one

with ``ORDER = AWQ_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]`` (``awq/utils/packing_utils.py``; unpacking
applies ``AWQ_REVERSE_ORDER = [0, 4, 1, 5, 2, 6, 3, 7]``). AWQ has no ``g_idx``, so an act-order
layer cannot be written in it. Linear layers left in floating point are listed in
``modules_to_not_convert``, which transformers and vLLM both honour.

Neither layout has a per-input scale: a layer whose AWQ scale was not folded into the layer
before it (``input_scale``) is refused.
"""

from __future__ import annotations

import functools
import json
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

import torch
from torch import nn

from infopt.core.errors import UsageError
from infopt.core.safetensors_file import Deferred, write_safetensors
from infopt.exporters.staging import staged_output
from infopt.quantize.int4_format import MAXQ, Int4Weight, int4_layers, unpack_int4

AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)
GPTQ_FORMATS = ("gptq", "gptq_v2")
WEIGHTS_FILE = "model.safetensors"
SOURCE_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
                "tokenizer.model", "spiece.model", "sentencepiece.bpe.model", "vocab.txt", "vocab.json",
                "merges.txt", "chat_template.jinja", "chat_template.json", "generation_config.json")
"""Files copied from ``source_dir`` so the folder loads on its own (never config or weights)."""

FP16_MAX = torch.finfo(torch.float16).max


class CheckpointLayoutError(UsageError):
    """The model holds something the requested checkpoint layout cannot express."""

    title = "cannot write checkpoint"


class V1ZeroPointError(CheckpointLayoutError):
    """A zero point of 0 next to code 15: GPTQ's v1 format (zero - 1) cannot hold it; v2 can."""


def pack_nibbles(codes: torch.Tensor) -> torch.Tensor:
    """``[..., 8]`` values 0..15 -> int32 ``[...]`` with value ``i`` at bits ``4 * i`` (two's complement)."""
    if sys.byteorder == "little":  # two codes a byte, four bytes read as one int32: the same bits, no int64 copy
        codes = codes.to(torch.uint8)
        pairs = (codes[..., 0::2] | (codes[..., 1::2] << 4)).contiguous()
        return pairs.view(torch.int32).squeeze(-1)
    shifts = torch.arange(0, 32, 4, dtype=torch.int64)
    words = (codes.to(torch.int64) << shifts).sum(dim=-1)
    return torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)


def group_index(weight: Int4Weight) -> torch.Tensor:
    """The group of each input feature: ``g_idx`` or ``k // group_size``, int64 ``[K]``."""
    if weight.g_idx is not None:
        return weight.g_idx.long()
    return torch.arange(weight.in_features) // weight.group_size


def _fp16_scales(name: str, weight: Int4Weight) -> torch.Tensor:
    if weight.scales.abs().max() > FP16_MAX:
        raise CheckpointLayoutError(f"{name}'s scales exceed fp16's range ({FP16_MAX:g}), which both layouts store",
                                    where=name, fix="rescale the layer's weights or keep it in floating point")
    return weight.scales.t().contiguous().to(torch.float16)


def _check_packable(name: str, weight: Int4Weight, layout: str) -> None:
    if weight.input_scale is not None:
        raise CheckpointLayoutError(
            f"{name} divides its input by an AWQ scale that was not folded into the layer before it; "
            f"the {layout} layout has no place for that scale",
            where=name,
            fix="quantize with GPTQ or RTN, or build the ONNX model, which keeps the scale as a Mul")
    if weight.out_features % 8:
        raise CheckpointLayoutError(
            f"{name} has {weight.out_features} outputs, not a multiple of 8, and the {layout} layout packs "
            f"eight zero points per int32 along the outputs", where=name,
            fix="keep this layer in floating point (leave it out of INT4 quantization)")


def check_gptq(name: str, weight: Int4Weight, checkpoint_format: str = "gptq") -> None:
    """Raise what :func:`pack_gptq` would raise for the layer, packing nothing (the codes are read only where a
    zero point of 0 may leave the v1 format without an encoding)."""
    if checkpoint_format not in GPTQ_FORMATS:
        raise UsageError(f"unknown GPTQ checkpoint format {checkpoint_format!r}",
                         fix=f"use one of {', '.join(GPTQ_FORMATS)}")
    _check_packable(name, weight, "GPTQ")
    if weight.in_features % 8:
        raise CheckpointLayoutError(
            f"{name} has {weight.in_features} inputs, not a multiple of 8, and the GPTQ layout packs eight codes "
            f"per int32 along the inputs", where=name, fix="keep this layer in floating point")
    _fp16_scales(name, weight)
    if checkpoint_format == "gptq" and bool((weight.zeros == 0).any()):
        _shift_zero_groups(name, unpack_int4(weight.qweight), weight.zeros.long(), group_index(weight))


def pack_gptq(name: str, weight: Int4Weight, checkpoint_format: str = "gptq") -> dict[str, torch.Tensor]:
    """``qweight``, ``qzeros``, ``scales`` and ``g_idx`` of one layer in the GPTQ layout (module docstring)."""
    check_gptq(name, weight, checkpoint_format)
    n, k = weight.out_features, weight.in_features
    codes = unpack_int4(weight.qweight)  # uint8: pack_nibbles reads them as bytes
    zeros = weight.zeros.long()
    groups = group_index(weight)
    if checkpoint_format == "gptq":
        codes, zeros = _shift_zero_groups(name, codes, zeros, groups)
        zeros = zeros - 1
    qweight = pack_nibbles(codes.t().reshape(k // 8, 8, n).transpose(1, 2))
    qzeros = pack_nibbles((zeros & 0xF).t().reshape(-1, n // 8, 8))
    return {"qweight": qweight.contiguous(), "qzeros": qzeros.contiguous(), "scales": _fp16_scales(name, weight),
            "g_idx": groups.to(torch.int32)}


def _shift_zero_groups(name: str, codes: torch.Tensor, zeros: torch.Tensor,
                       groups: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Rewrite zero 0 as zero 1 with every code of that row and group plus one, where no code is 15."""
    at_zero = zeros == 0
    if not bool(at_zero.any()):
        return codes, zeros
    top = torch.zeros_like(zeros).scatter_reduce(1, groups.expand_as(codes), codes.long(), "amax", include_self=False)
    stuck = at_zero & (top == MAXQ)
    if bool(stuck.any()):
        raise V1ZeroPointError(
            f"{name} has {int(stuck.sum())} row groups with zero point 0 that use code 15; GPTQ's v1 checkpoint "
            f"format stores zero - 1 and cannot hold them", where=name,
            fix='write checkpoint_format="gptq_v2" (read by vLLM and GPTQModel), or quantize symmetrically')
    return codes + at_zero[:, groups].to(codes.dtype), torch.where(at_zero, torch.ones_like(zeros), zeros)


def pack_awq(name: str, weight: Int4Weight) -> dict[str, torch.Tensor]:
    """``qweight``, ``qzeros`` and ``scales`` of one layer in the AWQ GEMM layout (module docstring)."""
    _check_packable(name, weight, "AWQ")
    if not weight.sorted_groups():
        raise CheckpointLayoutError(
            f"{name} was quantized with act-order (its g_idx reorders the groups) and the AWQ layout has no g_idx",
            where=name, fix="write a GPTQ checkpoint instead, or quantize without act-order")
    n, k = weight.out_features, weight.in_features
    order = list(AWQ_ORDER)
    codes = unpack_int4(weight.qweight).t().reshape(k, n // 8, 8)[..., order]
    zeros = weight.zeros.t().reshape(-1, n // 8, 8)[..., order]
    return {"qweight": pack_nibbles(codes).contiguous(), "qzeros": pack_nibbles(zeros).contiguous(),
            "scales": _fp16_scales(name, weight)}


def write_gptq_checkpoint(model: nn.Module, out: Path | str, *, config: Mapping[str, Any] | None = None,
                          source_dir: Path | str | None = None, checkpoint_format: str = "gptq",
                          force: bool = False) -> Path:
    """Write ``model`` as a GPTQ checkpoint folder at ``out``; returns ``out``.

    ``config`` is the model's config as a dict (default: ``model.config.to_dict()``);
    ``checkpoint_format`` is ``"gptq"`` (v1) or ``"gptq_v2"``; ``force`` replaces an existing folder.
    """
    layers = _quantized_layers(model)
    group_size = _common_group_size(layers)
    tensors = _deferred_packs(layers, lambda name, weight: pack_gptq(name, weight, checkpoint_format), gptq_shapes)
    quantized = sorted(layers)
    quant_config = {
        "quant_method": "gptq", "bits": 4, "group_size": group_size,
        "desc_act": not all(w.sorted_groups() for w in layers.values()),
        "sym": all(bool((w.zeros == 8).all()) for w in layers.values()),
        "checkpoint_format": checkpoint_format, "format": checkpoint_format,
        "lm_head": False,
        "block_name_to_quantize": _common_prefix(quantized),
        "modules_in_block_to_quantize": [quantized],
    }
    return _write(model, Path(out), tensors, layers, quant_config, config, source_dir, force)


def write_awq_checkpoint(model: nn.Module, out: Path | str, *, config: Mapping[str, Any] | None = None,
                         source_dir: Path | str | None = None, force: bool = False) -> Path:
    """Write ``model`` as an AWQ GEMM checkpoint folder at ``out``; returns ``out``.

    ``config`` is the model's config as a dict (default: ``model.config.to_dict()``); ``force``
    replaces an existing folder.
    """
    layers = _quantized_layers(model)
    group_size = _common_group_size(layers)
    tensors = _deferred_packs(layers, pack_awq, awq_shapes)
    float_linears = sorted(name for name, module in model.named_modules() if isinstance(module, nn.Linear))
    quant_config = {"quant_method": "awq", "bits": 4, "group_size": group_size, "zero_point": True,
                    "version": "gemm", "modules_to_not_convert": float_linears}
    return _write(model, Path(out), tensors, layers, quant_config, config, source_dir, force)


def gptq_shapes(weight: Int4Weight) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    """The shape and dtype of each tensor :func:`pack_gptq` makes for the layer, without packing it."""
    n, k, groups = weight.out_features, weight.in_features, int(weight.zeros.shape[1])
    return {"qweight": ((k // 8, n), torch.int32), "qzeros": ((groups, n // 8), torch.int32),
            "scales": ((groups, n), torch.float16), "g_idx": ((k,), torch.int32)}


def awq_shapes(weight: Int4Weight) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    """The same for :func:`pack_awq`."""
    n, k, groups = weight.out_features, weight.in_features, int(weight.zeros.shape[1])
    return {"qweight": ((k, n // 8), torch.int32), "qzeros": ((groups, n // 8), torch.int32),
            "scales": ((groups, n), torch.float16)}


class _LayerPacks:
    """One layer's packed tensors, made when the writer asks for the first and let go once it took the last."""

    def __init__(self, make: Callable[[], dict[str, torch.Tensor]]):
        self.make, self.made = make, None

    def take(self, key: str) -> torch.Tensor:
        if self.made is None:
            self.made = self.make()
        value = self.made.pop(key)
        if not self.made:
            self.made = None
        return value


def _deferred_packs(layers: Mapping[str, Int4Weight], pack, shapes) -> dict[str, Deferred]:
    """Each layer's packed tensors as :class:`~infopt.core.safetensors_file.Deferred` entries: the writer packs a
    layer when it reaches it, so the packed checkpoint is never held whole (0.2 GB at Qwen2.5-0.5B's shape)."""
    tensors = {}
    for name, weight in layers.items():
        packs = _LayerPacks(functools.partial(pack, name, weight))
        for key, (shape, dtype) in shapes(weight).items():
            tensors[f"{name}.{key}"] = Deferred(shape, dtype, functools.partial(packs.take, key))
    return tensors


@dataclass(frozen=True)
class CheckpointSource:
    """A checkpoint to write at the end of a build: the quantized Hugging Face module, its format
    (:func:`checkpoint_format`) and the folder it was loaded from (tokenizer and generation files)."""

    module: nn.Module | None
    format: str
    source_dir: Path | None = None
    written: Path | None = None
    """the folder it was already written to (:meth:`write_ahead`; the module is then let go)"""

    def write(self, out: Path, *, force: bool = False) -> Path:
        if self.written is not None:
            with staged_output(Path(out), force, is_ours=_is_checkpoint) as stage:
                for path in sorted(self.written.iterdir()):
                    shutil.copyfile(path, stage / path.name)
            return Path(out)
        return write_checkpoint(self.module, out, self.format, source_dir=self.source_dir, force=force)

    def write_ahead(self, folder: Path) -> "CheckpointSource":
        """Write the checkpoint to ``folder`` now (a work folder) and return the source that copies it from there:
        a text-generation build lets the quantized module go before it judges its folder (at Qwen2.5-0.5B's shape
        the module held about 0.5 GB through the judging, the build's peak)."""
        write_checkpoint(self.module, folder, self.format, source_dir=self.source_dir)
        return CheckpointSource(None, self.format, self.source_dir, Path(folder))


def checkpoint_format(model: nn.Module, layout: str) -> str:
    """The format ``model`` is written in for ``layout`` (``gptq`` or ``awq``): ``awq``, ``gptq`` (v1),
    or ``gptq_v2`` where a zero point has no v1 encoding. Raises what writing it would raise (a
    layer the layout cannot hold, several group sizes) without writing anything, so a build can
    refuse before its long steps rather than at the end."""
    layers = _quantized_layers(model)
    _common_group_size(layers)
    if layout == "awq":
        for name, weight in layers.items():
            pack_awq(name, weight)
        return "awq"
    try:
        for name, weight in layers.items():
            check_gptq(name, weight)
        return "gptq"
    except V1ZeroPointError:
        for name, weight in layers.items():
            check_gptq(name, weight, "gptq_v2")
        return "gptq_v2"


def write_checkpoint(model: nn.Module, out: Path | str, checkpoint_format: str, *,
                     source_dir: Path | str | None = None, force: bool = False) -> Path:
    """Write ``model`` in ``checkpoint_format`` (what :func:`checkpoint_format` returned) at ``out``."""
    if checkpoint_format == "awq":
        return write_awq_checkpoint(model, out, source_dir=source_dir, force=force)
    return write_gptq_checkpoint(model, out, source_dir=source_dir, checkpoint_format=checkpoint_format, force=force)


def _quantized_layers(model: nn.Module) -> dict[str, Int4Weight]:
    layers = int4_layers(model)
    if not layers:
        raise UsageError(f"{type(model).__name__} has no Int4Linear layers, so there is nothing to write as a "
                         f"4-bit checkpoint", where=type(model).__name__,
                         fix="quantize the model to INT4 first (--int4: RTN, GPTQ or AWQ)")
    return layers


def _common_group_size(layers: Mapping[str, Int4Weight]) -> int:
    sizes = {name: w.group_size for name, w in layers.items()}
    if len(set(sizes.values())) > 1:
        listing = ", ".join(f"{name}: {size}" for name, size in sizes.items())
        raise CheckpointLayoutError(f"the checkpoint's config holds one group size but the layers use several "
                                    f"({listing})", fix="quantize every layer with the same group size")
    return next(iter(sizes.values()))


def _common_prefix(names: list[str]) -> str:
    """The longest run of leading path components the module paths share ("model.layers")."""
    parts = [name.split(".") for name in names]
    common = []
    for column in zip(*parts):
        if len(set(column)) > 1:
            break
        common.append(column[0])
    if len(common) == min(len(p) for p in parts):
        common = common[:-1]
    return ".".join(common)


def _model_config(model: nn.Module, config: Mapping[str, Any] | None) -> dict[str, Any]:
    if config is None:
        hf_config = getattr(model, "config", None)
        if hf_config is None or not hasattr(hf_config, "to_dict"):
            raise UsageError(f"{type(model).__name__} has no config to write as config.json",
                             fix="pass config= (the model's transformers config as a dict)")
        config = hf_config.to_dict()
    config = json.loads(json.dumps(dict(config), default=str))
    if not config.get("architectures"):
        config["architectures"] = [type(model).__name__]
    config["dtype"] = "float16"
    if "torch_dtype" in config:
        config["torch_dtype"] = "float16"
    return config


def _dense_tensors(model: nn.Module, layers: Mapping[str, Int4Weight]) -> dict[str, torch.Tensor]:
    """Every state-dict entry outside the quantized layers under its own name, as the model holds it (written in
    fp16 if floating), but a head tied to the embedding: transformers and vLLM tie it again on load (the config's
    ``tie_word_embeddings``), and a second copy of the table was a quarter of Qwen2.5-0.5B's checkpoint."""
    tensors = {}
    tied = _tied_head(model)
    for key, value in model.state_dict().items():
        if key.rpartition(".")[0] in layers or key == tied:
            continue
        tensors[key] = value.detach()
    return tensors


def _tied_head(model: nn.Module) -> str | None:
    """The state-dict key of ``model``'s output embedding where it is the input embedding's table, else None."""
    config = getattr(model, "config", None)
    try:
        head, table = model.get_output_embeddings(), model.get_input_embeddings()
    except (AttributeError, NotImplementedError):
        return None
    if not getattr(config, "tie_word_embeddings", False) or head is None or table is None or head.weight is not table.weight:
        return None
    return next((f"{name}.weight" for name, module in model.named_modules() if module is head), None)


def _is_checkpoint(path: Path) -> bool:
    """A folder this module wrote: a config.json with a quantization_config beside its weights."""
    try:
        config = json.loads((path / "config.json").read_text())
    except (OSError, ValueError):
        return False
    return isinstance(config, dict) and "quantization_config" in config and (path / WEIGHTS_FILE).exists()


def _write(model: nn.Module, out: Path, tensors: dict[str, torch.Tensor], layers: Mapping[str, Int4Weight],
           quant_config: dict[str, Any], config: Mapping[str, Any] | None, source_dir: Path | str | None,
           force: bool) -> Path:
    config = _model_config(model, config)
    config["quantization_config"] = quant_config
    for name in layers:
        bias = model.get_submodule(name).bias
        if bias is not None:
            tensors[f"{name}.bias"] = bias.detach().cpu().to(torch.float16).contiguous()
    tensors.update(_dense_tensors(model, layers))
    sources = _source_files(source_dir)
    with staged_output(out, force, is_ours=_is_checkpoint) as stage:
        write_safetensors(stage / WEIGHTS_FILE, tensors, {"format": "pt"}, floats=torch.float16)
        (stage / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
        for path in sources:
            shutil.copy2(path, stage / path.name)
    return out


def _source_files(source_dir: Path | str | None) -> list[Path]:
    if source_dir is None:
        return []
    source_dir = Path(source_dir)
    if not source_dir.is_dir():
        raise UsageError(f"source folder {source_dir} does not exist or is not a folder", where=str(source_dir),
                         fix="pass the folder the model was loaded from (with its tokenizer files), or leave it out")
    return [source_dir / name for name in SOURCE_FILES if (source_dir / name).is_file()]


__all__ = ["AWQ_ORDER", "CheckpointLayoutError", "CheckpointSource", "GPTQ_FORMATS",
           "checkpoint_format", "pack_awq", "pack_gptq", "pack_nibbles", "write_awq_checkpoint", "write_checkpoint",
           "write_gptq_checkpoint"]
