"""INT8 pass: static (calibrated QDQ) or dynamic INT8, held inside a drift budget.

``mode: auto`` is static when calibration data is given and dynamic otherwise (a GPU target
needs static: TensorRT has no dynamic INT8). The pass ranks every layer by the drift it adds
alone, then, while the budget (a metric and a bound, ``--max-drift``) is missed, keeps the most
sensitive layer in FP32, one at a time. The last step is checked on the real quantized model,
not only on the probe; the per-layer table goes into the manifest and the report.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import Field, field_validator

from infopt.core import onnx_graph
from infopt.core.artifact import Artifact
from infopt.core.errors import UsageError
from infopt.core.pass_api import Pass, PassContext, PassDetails, PassOptions, PassOutcome
from infopt.passes.onnx.int8_sections import int8_notes, int8_sections, int8_shipped_precision
from infopt.quantize import calibrators, int8_variants, layer_timing, onnx_int8, sensitivity
from infopt.quantize.calibrate import calibrate
from infopt.quantize.observers import Observer
from infopt.quantize.sensitivity import Budget, first_samples, output_drift
from infopt.runtime.backends.onnxruntime import OrtRunner

CALIB_FIX = ("pass --calib PATH: a folder or file of .npy/.npz/.pt samples shaped like the model's inputs "
             "(a few hundred real samples; calibration=... in the API)")


class QuantizeInt8Options(PassOptions):
    SETTINGS: ClassVar[dict[str, str]] = {
        "method": "calib_method", "percentile": "calib_percentile", "bins": "calib_bins",
        "require_int8": "require_precision", "speed_weights": "batch_mix", "speed_batch_sizes": "batch_sizes"}
    mode: Literal["auto", "static", "dynamic"] = Field(
        "auto", description="static needs calibration data; auto picks static when there is some")
    method: str = Field("minmax", description=f"how activation ranges are calibrated: {', '.join(calibrators.names())}, "
                                              "or another method registered in quantize/calibrators.py")
    percentile: float = Field(99.99, gt=50.0, le=100.0, description="percentile kept by the percentile method")
    bins: int = Field(2048, ge=256, description="histogram bins for percentile, entropy and mse")
    placement: Literal["auto", "onnxruntime", "tensorrt"] = Field(
        "auto", description="QDQ layout: ONNX Runtime CPU (u8 activations) or TensorRT (symmetric s8); auto follows the target")
    budget: str = Field("cosine_mean=0.99", description="drift budget METRIC=VALUE the fallback holds (overridden by --max-drift)")
    fallback: bool = Field(True, description="keep the most sensitive layers in FP32 until the budget holds")
    sensitivity_samples: int = Field(16, ge=1, description="samples used to rank layer sensitivity (the ranking only "
                                                           "orders the layers; the budget is checked on all the data)")
    fallback_order: Literal["drift_per_ms", "drift"] = Field(
        "drift_per_ms", description="the order the fallback moves layers to FP32: drift_per_ms, the most drift per "
                                    "millisecond the layer's INT8 form saves (ONNX Runtime's profiler, CPU targets); "
                                    "drift, the most drift alone")
    choose: Literal["fastest", "first"] = Field(
        "fastest", description="fastest: build the INT8 variants worth trying (activation type, weight scales, layers "
                               "after pooling in float), time each against FP32 and ship the fastest that holds the "
                               "budget, or FP32 when none is faster (ONNX Runtime on a CPU target); first: ship the first")
    require_int8: bool = Field(False, description="ship INT8 even when FP32 is faster here (--require-precision)")
    keep_float: list[str] = Field(default_factory=list,
                                  description="modules whose layers stay in float, by the last part of their path "
                                              "(lm_head: an LM's output head, whose logits pick every token)")
    speed_trials: int = Field(5, ge=3, description="ABBA trials per batch size when timing the variants")
    speed_weights: dict[int, float] = Field(default_factory=dict,
                                            description="each timed batch size's share of requests (--batch-mix), "
                                                        "which weighs it when the variants are compared with FP32")
    speed_batch_sizes: list[int] = Field(default_factory=list,
                                         description="batch sizes the variants are timed at (default: the batch dim's min "
                                                     "and opt, or --batch-sizes: the sizes the model serves)")

    @field_validator("method")
    @classmethod
    def _registered(cls, value: str) -> str:
        if value not in calibrators.names():
            raise ValueError(f"unknown calibration method {value!r}; use one of: {', '.join(calibrators.names())}")
        return value


def resolve_placement(placement: str, target) -> str:
    """The QDQ layout: the option's, or for ``auto`` TensorRT's on GPU targets, ONNX Runtime's on CPU."""
    if placement != "auto":
        return placement
    return "tensorrt" if target.device == "cuda" else "onnxruntime"


def choose_mode(mode: str, placement: str, has_calibration: bool, target_name: str) -> str:
    """static or dynamic, or an error that says how to get the one the target needs."""
    if placement == "tensorrt" and not has_calibration and mode != "static":
        raise UsageError(f"target {target_name} runs INT8 through TensorRT, which needs static (calibrated) INT8, "
                         "and no calibration data was given", fix=CALIB_FIX)
    if mode == "static" and not has_calibration:
        raise UsageError("static INT8 needs calibration data and none was given", fix=CALIB_FIX)
    if mode == "dynamic" and placement == "tensorrt":
        raise UsageError(f"target {target_name} runs INT8 through TensorRT, which has no dynamic INT8",
                         fix=f"use static INT8: {CALIB_FIX}")
    if mode == "auto":
        return "static" if has_calibration else "dynamic"
    return mode


def check(options: QuantizeInt8Options, target, has_calibration: bool) -> None:
    """Pre-flight: the mode the options and the target need can run with the data given."""
    choose_mode(options.mode, resolve_placement(options.placement, target), has_calibration, target.name)


def run(artifact: Artifact, options: QuantizeInt8Options, context: PassContext) -> PassOutcome:
    import onnx

    placement = resolve_placement(options.placement, context.target)
    mode = choose_mode(options.mode, placement, context.calibration is not None, context.target.name)
    budget = Budget.parse(context.budget or options.budget)
    model = onnx.load(str(artifact.path))
    onnx_graph.ensure_node_names(model)
    del model.graph.value_info[:]  # the quantizers re-infer shapes; stale exporter hints can contradict them
    src = onnx_graph.save_model(model, context.workdir / "fp32-named.onnx")
    found = onnx_int8.layers(model, onnx_int8.STATIC_OPS if mode == "static" else onnx_int8.DYNAMIC_OPS)
    layers = [x for x in found if x.module.split(".")[-1] not in options.keep_float]
    kept = [f"{len(found) - len(layers)} layer(s) of {', '.join(options.keep_float)} kept in float, as the recipe asks"
            ] if len(layers) < len(found) else []
    if layers and mode == "dynamic" and not options.fallback and not context.check_batches:
        return _unjudged(artifact, src, layers, kept, context)
    if not layers:
        kinds = "Conv/MatMul/Gemm" if mode == "static" else "MatMul"
        return PassOutcome(artifact, False,
                           [f"{mode} INT8: the model has no {kinds} layers with constant weights; the model is left as it is"],
                           Int8Details(mode=mode, shipped="fp32", selection=f"{mode} INT8 covers no layer of this model"))
    attachments, ranges, calib_info = {}, None, {}
    if mode == "static":
        batches = list(context.calibration.batches)
        table = _calibrate(src, layers, options, context)
        ranges = table.ranges
        table_path = table.save(context.workdir / "calibration.json")
        attachments["quantization/calibration.json"] = table_path
        calib_info = {"samples": table.samples, "source": context.calibration.source, "method": table.method,
                      "options": table.options, "cached": table.cached, "data_sha256": table.data_sha256}
    else:
        batches = list(context.check_batches or [])
    sample_batches = first_samples(batches, options.sensitivity_samples)
    probe = sensitivity.Probe(src, layers, ranges, symmetric=placement == "tensorrt")
    ranked: list[dict] | None = None
    measured_here = placement == "onnxruntime" and context.target.device == "cpu"  # timings on this CPU mean something
    by_cost = options.fallback_order == "drift_per_ms" and measured_here and bool(batches)

    def build(nodes: list[str], dst: Path) -> Path:
        if mode == "static":
            return onnx_int8.quantize_static(src, dst, ranges, nodes, placement=placement)
        return onnx_int8.quantize_dynamic(src, dst, nodes)

    def ranking() -> list[dict]:
        """Each layer's drift alone (and, on a CPU target, per millisecond its INT8 form saves), measured
        the first time the fallback needs it (never when every layer in INT8 holds)."""
        nonlocal ranked
        if ranked is None:
            ranked = sensitivity.rank(probe, sample_batches, budget, context.say)
            if by_cost:
                saved = _layer_savings(build, src, layers, batches, artifact.spec, context)
                ranked = sensitivity.order_by_cost(ranked, saved, budget)
        return ranked

    try:
        judged, reference, measured_on = _judged_on(context, batches, probe, mode)
        _check_budget_applies(budget, reference)
        strict = budget.with_margin()  # what the choices hold to, so that the verdict holds (sensitivity.MARGIN)
        excluded, steps = (sensitivity.choose_fallback(probe, judged, strict, ranking, context.say, reference)
                           if options.fallback else ([], []))
        order = (lambda: [r["layer"] for r in ranking()]) if options.fallback else list
        dst, drift, excluded = _build_confirmed(build, layers, excluded, order, judged, reference, strict, context)
    finally:
        probe.close()
    int8_nodes = [layer.node for layer in layers if layer.node not in excluded]
    shipped, selection, tried, variant = "int8", None, [], None
    if options.choose == "fastest" and measured_here and int8_nodes:
        best, selection, tried = _fastest(mode, src, model, layers, int8_nodes, ranges, (dst, drift), judged,
                                          reference, strict, options, artifact.spec, context)
        if best is None:
            shipped, dst, drift, int8_nodes = "fp32", artifact.path, {}, []
        else:
            dst, drift, int8_nodes, variant = best.path, best.drift, best.nodes, best.name
    quantized = [layer for layer in layers if layer.node in int8_nodes]
    met = budget.holds(drift) if shipped == "int8" else True
    if met:
        verdict = ""
    elif len(excluded) == len(layers):
        verdict = " - NOT met even with every layer in FP32"
    else:
        verdict = " - NOT met"
    details = Int8Details(mode=mode, placement=placement, budget=str(budget), selection_budget=str(strict),
                          budget_metric=budget.metric,
                          budget_threshold=budget.threshold, budget_met=met, measured=drift,
                          measured_on=measured_on,
                          calibration=calib_info, excluded=excluded, fallback_steps=steps, ranked=ranked is not None,
                          fallback_order=("drift_per_ms" if by_cost else "drift") if ranked is not None else None,
                          layers=_layer_rows(ranked, layers, excluded, budget, int8_nodes),
                          quantized_ops=onnx_int8.quantized_nodes(dst), shipped=shipped, selection=selection,
                          shipped_variant=variant, variants=[t.to_json() for t in tried])
    if shipped == "fp32":
        notes = [f"{mode} INT8 ({_why(mode, context)}): {selection}"]
        return PassOutcome(artifact, False, notes, details)
    notes = [f"{mode} INT8 ({_why(mode, context)}): {len(quantized)}/{len(layers)} layers in INT8"
             + (f", {len(excluded)} kept in FP32 by the fallback" if excluded else ""),
             f"budget {budget}: measured {drift.get(budget.metric):.6g} on {details.measured_on}{verdict}"]
    if selection:
        notes.append(f"variant: {selection}")
    result = artifact.derive("onnx", path=dst)
    result.attachments.update(attachments)
    return PassOutcome(result, True, notes, details)


def _unjudged(artifact: Artifact, src: Path, layers, kept: list[str], context: PassContext) -> PassOutcome:
    """Dynamic INT8 of every layer, with no data to measure drift on here (a text-generation decoder, whose
    build judges the generator it ships under teacher forcing): nothing to fall back from, nothing measured."""
    context.say(f"dynamic INT8 of {len(layers)} layers")
    dst = onnx_int8.quantize_dynamic(src, context.workdir / "int8.onnx", [x.node for x in layers])
    ops = onnx_int8.quantized_nodes(dst)
    notes = [f"dynamic INT8 (int8 weights per output channel, activations quantized per call): {len(layers)} layers",
             *kept, ", ".join(f"{n} {op}" for op, n in sorted(ops.items())),
             "drift not measured by the pass (no data for it): the build's evaluator judges the model"]
    details = Int8Details(mode="dynamic", placement="onnxruntime", quantized_ops=ops,
                          layers=[{"layer": x.node, "op": x.op, "module": x.module, "precision": "int8"} for x in layers],
                          selection="every layer: no fallback asked and no data to judge by")
    return PassOutcome(artifact.derive("onnx", path=dst), True, notes, details)


def _fastest(mode, src, model, layers, int8_nodes, ranges, confirmed, batches, reference, budget, options, spec, context):
    """The INT8 variants tried against FP32 (``quantize/int8_variants.py``): (the one to ship or None
    for FP32, why, what was tried). The first variant is the model the fallback just confirmed."""
    variants = int8_variants.candidates(mode, src, model, layers, int8_nodes, ranges)
    first = int8_variants.Tried(variants[0].name, variants[0].why, int8_nodes, confirmed[0], confirmed[1],
                                budget.holds(confirmed[1]))
    tried = [first] + int8_variants.try_variants(variants[1:], context.workdir, batches, reference, budget, context.say)
    sizes = options.speed_batch_sizes or _speed_sizes(spec)
    feeds = int8_variants.timing_feeds(batches, sizes, spec)
    int8_variants.time_against_fp32(tried, src, feeds, options.speed_trials, context.say)
    best, why = int8_variants.choose(tried, options.require_int8, options.speed_weights or None)
    return best, why, tried


def _layer_savings(build, src, layers, batches, spec, context) -> dict[str, float]:
    """Milliseconds each layer's INT8 form saves over FP32 per run, from ONNX Runtime's profiler on the
    FP32 model and on the model with every layer in INT8, at the largest batch the variants are timed at."""
    size = max(_speed_sizes(spec))
    context.say(f"timing each layer in FP32 and INT8 at batch {size} (ONNX Runtime's profiler)")
    nodes = [layer.node for layer in layers]
    every = build(nodes, context.workdir / "every-layer-int8.onnx")
    feed = int8_variants.timing_feeds(batches, [size], spec)[size]
    return layer_timing.savings(src, every, nodes, feed)


def _speed_sizes(spec) -> list[int]:
    """The batch sizes the model will serve, as the build times its candidates at them: the batch dim's min and
    its opt (the size ``--dim batch=MIN:OPT:MAX`` declares it serves; default 1 and 8). ``--batch-sizes``
    replaces them (the builder passes them as ``speed_batch_sizes``)."""
    if spec.batch_symbol is None:
        return [1]
    dim = spec.dims[spec.batch_symbol]
    return sorted({dim.min, dim.opt})


class Int8Details(PassDetails):
    """What ``quantize_int8`` records: the mode, the budget and what it measured, and one row per layer."""

    mode: Literal["static", "dynamic"]
    layers: list[dict[str, Any]] = Field(default_factory=list)
    """layer, op, module, the budget metric's drift with the layer alone in INT8, sqnr_db, precision;
    empty when the model has no layer the mode covers"""
    placement: str | None = None
    budget: str | None = None
    selection_budget: str | None = None
    """the stricter budget the fallback and the variants were held to, so that the verdict holds"""
    budget_metric: str | None = None
    budget_threshold: float | None = None
    budget_met: bool | None = None
    measured: dict[str, Any] = Field(default_factory=dict)
    measured_on: str | None = None
    calibration: dict[str, Any] = Field(default_factory=dict)
    excluded: list[str] = Field(default_factory=list)
    """layers kept in FP32 by the fallback, in the order it restored them"""
    fallback_steps: list[dict[str, Any]] = Field(default_factory=list)
    ranked: bool = False
    fallback_order: Literal["drift_per_ms", "drift"] | None = None
    """how the ranked layers were ordered for the fallback (None: they were not ranked)"""
    quantized_ops: dict[str, int] = Field(default_factory=dict)
    shipped: Literal["int8", "fp32"] = "int8"
    """fp32 when no INT8 variant was faster than FP32 here and INT8 was not required, or when the mode covers
    no layer of the model (dynamic INT8 of a CNN)"""
    selection: str | None = None
    """why the shipped graph, with the timing figures"""
    shipped_variant: str | None = None
    """the name of the INT8 variant shipped, when variants were tried and one was"""
    variants: list[dict[str, Any]] = Field(default_factory=list)
    """every INT8 variant tried: its drift, whether it held the budget, its time against FP32 per batch size"""

    def notes(self) -> list[str]:
        return int8_notes(self)

    def sections(self) -> list:
        return int8_sections(self)

    def shipped_precision(self) -> str | None:
        return int8_shipped_precision(self)


def _why(mode: str, context: PassContext) -> str:
    if mode == "static":
        return f"calibrated on {context.calibration.count} samples from {context.calibration.source}"
    return "no calibration data; activations are quantized per batch at run time"


def _judged_on(context: PassContext, batches: list[dict], probe, mode: str) -> tuple[list[dict], list, str]:
    """(batches, reference outputs, what they are) the budget is checked on. In a build, the data and the source
    model's outputs the build's verdict judges the shipped model by (``--val``, else the held-out calibration
    samples, else the seeded random inputs), so that a model chosen to meet the budget meets it when judged;
    otherwise (the pass run alone) the pass's own data against the FP32 graph."""
    import numpy as np

    given, eager = list(context.check_batches or []), context.check_reference
    if given and eager:
        reference = [np.concatenate([np.asarray(outs[i]) for outs in eager]) for i in range(len(eager[0]))]
        fp32 = probe.reference(given[:1])
        if len(fp32) == len(reference) and all(f.shape[1:] == r.shape[1:] for f, r in zip(fp32, reference)):
            return given, reference, f"{context.check_source}, against the source model (as the build is judged)"
    return batches, probe.reference(batches), "calibration data" if mode == "static" else context.check_source


def _check_budget_applies(budget, reference) -> None:
    """Refuse a budget metric the model's outputs do not have: the fallback could not measure it,
    and every quantized model would meet it."""

    if output_drift(reference, reference).get(budget.metric) is not None:
        return
    shapes = ", ".join(str(tuple(r.shape)) for r in reference)
    why = ("top1 (argmax agreement over classes) needs a [batch, classes] output" if budget.metric == "top1"
           else f"{budget.metric} is not defined for them")
    raise UsageError(f"drift budget {budget} cannot be measured on this model's outputs (shaped {shapes}): {why}",
                     fix="use a metric every output has, e.g. --max-drift cosine_mean=0.99 or sqnr_db=30 "
                         "(max_drift=... in the API)")


def _calibrate(src, layers, options, context):
    context.say(f"calibrating {options.method} on {context.calibration.count} samples")
    observer = Observer(options.method, options.percentile, options.bins)
    return calibrate(src, onnx_int8.calibration_tensors(layers), context.calibration, observer)


def _build_confirmed(build, layers, excluded, order, batches, reference, budget, context):
    """Build the real INT8 model and measure it against the FP32 ``reference``; while it misses the
    budget, move the next layer of ``order()`` (called only then) to FP32 and build again."""
    import numpy as np

    excluded = list(excluded)
    while True:
        nodes = [layer.node for layer in layers if layer.node not in excluded]
        context.say(f"building INT8 model with {len(nodes)}/{len(layers)} layers")
        dst = build(nodes, context.workdir / "int8.onnx")
        candidate = OrtRunner(dst)
        outs = [candidate.run(b) for b in batches]
        drift = output_drift(reference, [np.concatenate([o[i] for o in outs]) for i in range(len(reference))])
        if budget.holds(drift):
            return dst, drift, excluded
        remaining = [n for n in order() if n not in excluded]
        if not remaining:
            return dst, drift, excluded
        excluded.append(remaining[0])


def _layer_rows(ranked, layers, excluded, budget, int8_nodes) -> list[dict]:
    """One row per layer: most sensitive first when the layers were ranked, else in graph order with no drift figure."""
    rows = ranked if ranked is not None else [{"layer": x.node, "op": x.op, "module": x.module, "drift": {}} for x in layers]

    def precision(layer: str) -> str:
        return "int8" if layer in int8_nodes else "fp32 (fallback)" if layer in excluded else "fp32 (faster)"

    return [{"layer": r["layer"], "op": r["op"], "module": r["module"],
             budget.metric: r["drift"].get(budget.metric), "sqnr_db": r["drift"].get("sqnr_db"),
             "precision": precision(r["layer"]), "ms_saved": r.get("ms_saved")} for r in rows]


PASS = Pass(
    name="quantize_int8",
    consumes="onnx",
    produces="onnx",
    run=run,
    options=QuantizeInt8Options,
    details=Int8Details,
    description="INT8 weights and activations: static QDQ from calibration, or dynamic; sensitivity-guided FP32 fallback",
    check=check,
)
