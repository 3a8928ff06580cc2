"""The quantized forms of a text-generation decoder, and the budgets they are judged by.

- ``--int4``: the causal LM's Linear layers become INT4 weight-only layers with infopt's RTN, GPTQ or
  AWQ (``quantize/weight_only.py``, the same methods as every INT4 build) before the decoder is
  captured; the ONNX exporter lowers them to ONNX Runtime's ``MatMulNBits``. GPTQ and AWQ calibrate
  on ``--calib`` text through the folder's tokenizer.
- ``--int8``: dynamic INT8 on the exported decoder: int8 weights per output channel, activations
  quantized per call (``MatMulInteger``), ONNX Runtime's ``quantize_dynamic``.

The output head (``lm_head``) is left out of the methods (its logits pick every token). ``--int8`` keeps it
in float; ``--int4`` rounds it afterwards in the ONNX graph (RTN, :func:`int4_head`), since in a small LM
it is the largest layer, read for every token, as ONNX Runtime GenAI's builder does too.

A quantized folder is judged under teacher forcing on held-out text against the FP32 model: per-token top-1
agreement and perplexity, each held to a budget (``--max-drift``).
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from infopt.core.errors import UsageError
from infopt.core.lineage import PassRecord
from infopt.exporters.int4_checkpoint import CheckpointSource, checkpoint_format
from infopt.passes.lower.onnx_int4 import BLOCK_SIZES, replace_with_nbits
from infopt.quantize.int4_config import Int4Config
from infopt.quantize.int4_format import conv1d_as_linear
from infopt.quantize.onnx_int8 import DYNAMIC_OPS, layers, quantize_dynamic, quantized_nodes
from infopt.quantize.rtn import rtn_quantize
from infopt.quantize.weight_only import quantize_int4

PRECISIONS = ("fp32", "int8", "int4")
HEADS = {"lm_head", "embed_out"}
"""the output heads kept in float (transformers' names: most families, GPT-NeoX)"""
METRICS = {"top1": "min", "ppl_delta": "max"}
"""the budgets of a generation build: top-1 agreement with FP32 (at least) and the relative perplexity
increase over FP32 (at most; 0.05 is 5 %)"""
MEANING = {"top1": "top-1 agreement with the FP32 model under teacher forcing",
           "ppl_delta": "relative perplexity increase over the FP32 model"}
FIX = ("calibrate with --calib TEXT.txt (GPTQ), or set the budget with --max-drift top1=...,ppl_delta=...; "
       "a model with random weights agrees little, its logits being nearly flat")
DEFAULT_BUDGETS = {
    "fp32": {},
    "int8": {"top1": 0.90, "ppl_delta": 0.02},
    "int4": {"top1": 0.80, "ppl_delta": 0.10},
}
"""the budgets a build is held to when ``--max-drift`` does not say; FP32 is held to equal greedy tokens"""


@dataclass(frozen=True)
class Budgets:
    limits: dict[str, float]

    def checks(self, measured: dict) -> list[dict]:
        rows = []
        for metric, limit in self.limits.items():
            value = measured[metric]
            passed = value >= limit if METRICS[metric] == "min" else value <= limit
            rows.append({"name": metric, "measured": value, "limit": limit, "passed": bool(passed)})
        return rows

    def __str__(self) -> str:
        return ", ".join(f"{m} {'>=' if METRICS[m] == 'min' else '<='} {v:g}" for m, v in self.limits.items())


def budgets(precision: str, max_drift: str | None) -> Budgets:
    """The precision's default budgets, with those ``--max-drift`` gives (``top1=0.9,ppl_delta=0.05``) in their place."""
    limits = dict(DEFAULT_BUDGETS[precision])
    fix = "write METRIC=VALUE[,METRIC=VALUE] with METRIC top1 (agreement, at least) or ppl_delta (relative " \
          "perplexity increase over FP32, at most), e.g. --max-drift top1=0.9,ppl_delta=0.05"
    for part in filter(None, (p.strip() for p in (max_drift or "").split(","))):
        metric, sep, value = part.partition("=")
        if not sep or metric.strip() not in METRICS:
            raise UsageError(f"--max-drift {part!r} names no metric of --task text-generation", fix=fix)
        try:
            limits[metric.strip()] = float(value)
        except ValueError:
            raise UsageError(f"--max-drift {part!r}: {value!r} is not a number", fix=fix) from None
    return Budgets(limits)


def int4_decoder(lm, method: str, group_size: int | None, act_order: bool, calibration: list[list[int]] | None,
                 folder: Path, say: Callable[[str], None]) -> tuple[object, PassRecord, dict, CheckpointSource | None]:
    """A copy of ``lm`` with its Linear layers (GPT-2's ``Conv1D`` included, the head excepted) in INT4, what was
    done, and the GPTQ checkpoint to write for vLLM (None where that layout cannot hold the model)."""
    import torch

    if method == "auto":
        method = "gptq" if calibration else "rtn"
    if group_size is not None and group_size not in BLOCK_SIZES:
        raise UsageError(f"--group-size {group_size}: ONNX Runtime's MatMulNBits takes "
                         f"{', '.join(map(str, BLOCK_SIZES))}", fix="pass --group-size 32, 64 or 128")
    given = {"group_size": group_size} if group_size else {}
    if act_order:
        given["act_order"] = True
    config = Int4Config(method=method, **given).method_config()
    if config.needs_data and not calibration:
        raise UsageError(f"INT4 {method.upper()} calibrates on text, and no --calib was given",
                         fix="pass --calib TEXT.txt (one passage per line), or --int4-method rtn")
    start = time.perf_counter()
    model = copy.deepcopy(lm).eval()
    conv1d = conv1d_as_linear(model)
    batches = None
    if config.needs_data:
        batches = [(torch.tensor([ids]), torch.ones(1, len(ids), dtype=torch.long)) for ids in calibration]
    # the GPTQ checkpoint for vLLM holds one group size: chosen for every layer before calibrating
    checkpoint = method != "awq" and not conv1d
    result = quantize_int4(model, config, batches, progress=say, uniform_group_size=checkpoint)
    sizes = sorted({row.group_size for row in result.layers}, reverse=True)
    notes = [f"{len(result.layers)} Linear layers to INT4 with {method.upper()} (group size "
             f"{'/'.join(map(str, sizes)) or config.group_size}, {'symmetric' if config.symmetric else 'asymmetric'}"
             f"{', act-order' if act_order else ''}); the output head is left to the ONNX graph (RTN)"]
    notes += [f"kept {name} in float: {why}" for name, why in result.kept.items()]
    if conv1d:
        notes.append(f"{len(conv1d)} transformers Conv1D layers quantized as the Linears they are (weight transposed)")
    if config.needs_data:
        notes.append(f"calibrated on {len(calibration)} passages of --calib text ({result.rows} token rows)")
    else:
        notes.append("round-to-nearest: no calibration" + ("" if method == "rtn" else " data"))
    source = None
    if checkpoint and result.layers:
        try:
            source = CheckpointSource(model, checkpoint_format(model, "gptq"), folder)
            notes.append(f"{source.format.upper()} checkpoint for servers/vllm/ (vLLM, transformers)")
        except UsageError as exc:
            notes.append(f"no 4-bit checkpoint for vLLM: {exc.what}")
    elif result.layers:
        notes.append("no 4-bit checkpoint for vLLM: " + ("AWQ's per-input scales have no place in it" if method == "awq"
                                                         else "transformers does not load one of a model with Conv1D layers"))
    record = PassRecord("quantize_int4", "torch", "torch", time.perf_counter() - start, None, True, notes=notes)
    facts = {"precision": "int4", "method": method, "layers": len(result.layers), "group_sizes": sizes,
             "act_order": act_order, "kept_in_float": sorted(result.kept), "calibration_passages": len(calibration or []),
             "format": "MatMulNBits (com.microsoft), 4-bit weights"}
    return model, record, facts, source


def int4_head(path: Path, group_size: int, accuracy_level: int) -> str | None:
    """The output head's MatMul in ``path`` (in place) as RTN INT4 ``MatMulNBits``: in a small LM it is the
    largest layer, read for every token. Returns a note, or None where the head is not a stored-weight MatMul."""
    import numpy as np
    import onnx_ir as ir
    import torch

    model = ir.load(str(path))
    for node in list(model.graph):
        scopes = node.metadata_props.get("pkg.torch.onnx.name_scopes", "")
        named = [s.strip(" '\"") for s in scopes.strip("[]").split(",")][:-1]
        weight = node.inputs[1] if node.op_type == "MatMul" and len(node.inputs) == 2 else None
        if not named or named[-1].split(".")[-1] not in HEADS or weight is None:
            continue
        transpose = weight.producer()  # a head tied to the embedding: MatMul(x, Transpose(embedding))
        if weight.const_value is not None:
            rows = weight.const_value.numpy().T  # MatMul's [K, N] as the Linear's [N, K]
        elif transpose is not None and transpose.op_type == "Transpose" and transpose.inputs[0].const_value is not None:
            rows = transpose.inputs[0].const_value.numpy()
        else:
            continue
        rows = torch.from_numpy(np.ascontiguousarray(rows)).float()
        size = next((g for g in (group_size, 64, 32, 16) if g <= group_size and rows.shape[1] % g == 0), None)
        if size is None:
            return f"the output head stays in float: no group size divides its {rows.shape[1]} inputs"
        packed = rtn_quantize(rows, size, symmetric=False)
        replace_with_nbits(model.graph, node, node.inputs[0], packed.qweight.numpy(), packed.scales.numpy(),
                           packed.zeros.numpy(), None, size, accuracy_level, named[-1])
        if weight.const_value is None and not weight.uses():
            model.graph.remove(transpose, safe=True)
        elif not weight.uses():
            model.graph.initializers.pop(weight.name, None)
        ir.save(model, str(path))
        return (f"the output head ({named[-1]}, {rows.shape[0]} x {rows.shape[1]}) to INT4 by RTN, group size {size}: "
                "the largest layer of a small LM, read for every token")
    return None


def int8_onnx(src: Path, dst: Path) -> tuple[PassRecord, dict]:
    """Dynamic INT8 (per output channel) of every MatMul with a stored weight in ``src`` but the head's."""
    import onnx

    start = time.perf_counter()
    model = onnx.load(str(src))
    found, gemms = layers(model, DYNAMIC_OPS), layers(model, ("Gemm",))
    nodes = [layer.node for layer in found if layer.module.split(".")[-1] not in HEADS]
    dst.parent.mkdir(parents=True, exist_ok=True)
    quantize_dynamic(src, dst, nodes, per_channel=True)
    counts = quantized_nodes(dst)
    notes = [f"{len(nodes)} of {len(found)} MatMuls to dynamic INT8 (int8 weights per output channel, activations "
             "quantized per call); the output head stays in float",
             ", ".join(f"{n} {op}" for op, n in sorted(counts.items()))]
    if gemms:
        notes.append(f"{len(gemms)} Gemm layers stay in float: ONNX Runtime's dynamic INT8 takes MatMul only "
                     "(the model flattens their input to 2-D)")
    record = PassRecord("quantize_int8", "onnx", "onnx", time.perf_counter() - start, dst.stat().st_size, True,
                        notes=notes)
    return record, {"precision": "int8", "method": "dynamic", "per_channel": True, "layers": len(nodes),
                    "format": "MatMulInteger, int8 weights per output channel"}


def prepare_for_int8(lm):
    """A copy of ``lm`` whose ``Conv1D`` layers are Linears (they export as MatMul, which dynamic INT8 takes)."""

    model = copy.deepcopy(lm).eval()
    conv1d_as_linear(model)
    return model
