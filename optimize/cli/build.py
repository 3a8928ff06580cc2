"""``infopt build``: model file in, validated output folder out."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Optional, get_args

import typer

from infopt.cli import options as o
from infopt.cli.output import print_json, shown_path, stderr, stdout, table
from infopt.core import step_times
from infopt.core.errors import UsageError
from infopt.quantize import calibrators
from infopt.quantize.method_names import Int4MethodName


def _choices(names) -> str:
    """``a, b or c``: a plugin list as the help text says it."""
    names = list(names)
    return ", ".join(names[:-1]) + " or " + names[-1] if len(names) > 1 else "".join(names)


def build(
    model: Annotated[Path, typer.Argument(help="Model file: TorchScript .pt, torch.export .pt2, state_dict .pt, .onnx, a Hugging Face model folder, or a Hugging Face model id (org/name[@revision]) from the hub or its cache.")],
    target: Annotated[str, typer.Option("--target", "-t", help="Target to build for (see `infopt targets`).")] = "cpu",
    precision: Annotated[Optional[str], typer.Option("--precision", "-p", help="fp32, fp16, bf16, fp8, int8 or int4.")] = None,
    fp32: Annotated[bool, typer.Option("--fp32", metavar="", help="Same as --precision fp32.")] = False,
    fp16: Annotated[bool, typer.Option("--fp16", metavar="", help="Same as --precision fp16.")] = False,
    bf16: Annotated[bool, typer.Option("--bf16", metavar="", help="Same as --precision bf16.")] = False,
    fp8: Annotated[bool, typer.Option("--fp8", metavar="", help="Same as --precision fp8.")] = False,
    int8: Annotated[bool, typer.Option("--int8", metavar="", help="Same as --precision int8.")] = False,
    int4: Annotated[bool, typer.Option("--int4", metavar="", help="Same as --precision int4.")] = False,
    backend: Annotated[str, typer.Option("--backend", help="auto, onnxruntime, tensorrt or inductor.")] = "auto",
    inputs: o.Inputs = None,
    dims: o.Dims = None,
    val: o.Val = None,
    batch_sizes: o.BatchSizes = None,
    batch_mix: o.BatchMix = None,
    max_abs: o.MaxAbs = None,
    min_cosine: o.MinCosine = None,
    min_top1: o.MinTop1 = None,
    min_sqnr_db: o.MinSqnr = None,
    max_p99_ms: o.MaxP99 = None,
    recipe: Annotated[Optional[Path], typer.Option("--recipe", help="A recipe YAML file, or a bundled recipe's name (see `infopt recipes`), instead of choosing by target and backend.")] = None,
    name: Annotated[Optional[str], typer.Option("--name", help="Model name (default: the file's stem).")] = None,
    output: Annotated[Optional[Path], typer.Option("--output", "-o", help="Output folder (default: dist/<name>).")] = None,
    force: Annotated[bool, typer.Option("--force", metavar="", help="Replace an existing output folder.")] = False,
    model_class: o.ModelClass = None,
    model_args: o.ModelArgs = None,
    allow_pickle: o.AllowPickle = False,
    calib: Annotated[Optional[str], typer.Option("--calib", help="Calibration samples (.npy/.npz/.pt folder or file, or module:function); makes INT8 static.")] = None,
    calib_samples: Annotated[int, typer.Option("--calib-samples", help="Calibration samples to draw (seeded).")] = 128,
    tokenizer: Annotated[Optional[str], typer.Option("--tokenizer", help="Hugging Face tokenizer folder, for a --calib text file (one example per line).")] = None,
    calib_method: Annotated[Optional[str], typer.Option("--calib-method", help=f"{_choices(calibrators.names())}.")] = None,
    calib_percentile: Annotated[Optional[float], typer.Option("--calib-percentile", help="Percentile kept by --calib-method percentile.")] = None,
    calib_bins: Annotated[Optional[int], typer.Option("--calib-bins", help="Histogram bins for percentile, entropy and mse.")] = None,
    smoothquant_alpha: Annotated[Optional[float], typer.Option("--smoothquant-alpha", help="SmoothQuant migration strength, 0..1.")] = None,
    int4_method: Annotated[Optional[str], typer.Option("--int4-method", help=f"INT4: {_choices(get_args(Int4MethodName))} (default: gptq with --calib, rtn without).")] = None,
    group_size: Annotated[Optional[int], typer.Option("--group-size", help="INT4: input features per scale group (default 128).")] = None,
    act_order: Annotated[bool, typer.Option("--act-order", metavar="", help="INT4 GPTQ: quantize columns in order of activation size (checkpoint gets g_idx).")] = False,
    max_bits_per_weight: Annotated[Optional[float], typer.Option("--max-bits-per-weight", help="INT4 text generation: the quantized layers' average stored bits per weight at most (INT4 layers about 4.3-5.1, those kept for 8 bits 9.25); caps how many layers --calib keeps for 8 bits.")] = None,
    int4_checkpoint: Annotated[Optional[str], typer.Option("--int4-checkpoint", help="INT4: auto, gptq, awq or none: the 4-bit checkpoint written to servers/vllm/ for a Hugging Face model (auto: GPTQ layout; none after AWQ).")] = None,
    max_drift: Annotated[Optional[str], typer.Option("--max-drift", help="INT8 drift budget METRIC=VALUE, e.g. cosine_mean=0.995 or top1=0.99; sensitive layers fall back to FP32 until it holds.")] = None,
    require_precision: Annotated[bool, typer.Option("--require-precision", metavar="", help="Ship the precision asked for even when a faster one was measured (INT8 on a CPU where FP32 is faster).")] = False,
    strict: Annotated[bool, typer.Option("--strict", metavar="", help="Exit 3 when any candidate fails to build or run, even if others passed (default: ship the best that passed and warn).")] = False,
    allow_partial: Annotated[bool, typer.Option("--allow-partial", metavar="", hidden=True, help="The default now: ship the best candidate that passed when others failed.")] = False,
    price_per_hour: Annotated[Optional[float], typer.Option("--price-per-hour", help="USD per hour of the machine you deploy on, for the report's cost per million predictions, or output tokens with --task text-generation (replaces the target's).")] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", metavar="", help="Load the model and show what would be built (candidates, passes, inputs, output folder); write nothing.")] = False,
    task: Annotated[Optional[str], typer.Option("--task", help="text-generation: a causal LM's decoder with its KV cache, written as an ONNX Runtime GenAI folder and judged by generating from it (fp32, --int8, --int4; CPU), the default for a causal LM where it builds what was asked; logits: one graph from the inputs to the head's output, the default for every other model.")] = None,
    as_json: o.Json = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", metavar="", help="No progress display.")] = False,
) -> None:
    """Build, validate and emit a deployable artifact for a target."""
    from infopt.api import build as run_build
    from infopt.api import flags as api_flags
    from infopt.api.build_config import BuildConfig, flag_of
    from infopt.report.markdown import (
        candidates_section,
        drift_section,
        latency_section,
        pass_sections,
        passes_section,
        print_sections,
        summary,
    )

    flags = {"fp32": fp32, "fp16": fp16, "bf16": bf16, "fp8": fp8, "int8": int8, "int4": int4}
    if task not in (None, "logits", "text-generation"):
        raise UsageError(f"unknown --task {task!r}", fix="pass --task text-generation or --task logits (the default)")
    asked = api_flags.precision(flags, precision) if precision or any(flags.values()) else None  # else the recipe's
    api_flags.int4_settings(int4_method, group_size, act_order, int4_checkpoint)  # an unknown --int4-method exits 2 here
    config = BuildConfig.of(
        target=target, precision=asked, backend=backend, inputs=inputs, dims=dims, val=val,
        batch_sizes=o.parse_batch_sizes(batch_sizes), batch_mix=o.parse_batch_mix(batch_mix),
        thresholds=o.thresholds(max_abs=max_abs, min_cosine=min_cosine, min_top1=min_top1, min_sqnr_db=min_sqnr_db,
                                max_p99_ms=max_p99_ms),
        recipe=recipe, name=name, output=output, force=force, model_class=model_class, model_args=model_args,
        allow_pickle=allow_pickle, calibration=calib, calib_samples=calib_samples, tokenizer=tokenizer,
        max_drift=max_drift, int4_method=int4_method, group_size=group_size, act_order=act_order,
        int4_checkpoint=int4_checkpoint, calib_method=calib_method, calib_percentile=calib_percentile,
        calib_bins=calib_bins, smoothquant_alpha=smoothquant_alpha, max_bits_per_weight=max_bits_per_weight,
        strict=strict, require_precision=require_precision, dry_run=dry_run, price_per_hour=price_per_hour)
    if task is None:
        from infopt.api.task_choice import default_task, logits_choices

        logits_flags = [f"--{key}" for key in logits_choices(backend, recipe)]
        logits_flags += [flag_of(key) for key in config.logits_only_given()]
        logits_flags += [f"--{key.replace('_', '-')}" for key, value in
                         (("max_abs", max_abs), ("min_cosine", min_cosine), ("min_top1", min_top1),
                          ("min_sqnr_db", min_sqnr_db), ("max_p99_ms", max_p99_ms)) if value is not None]
        task, why = default_task(model, precision=asked, target=target, val=val, calib=calib, max_drift=max_drift,
                                 logits_flags=[f for f in logits_flags if f != flag_of("thresholds")], recipe=recipe)
        if why and not quiet and not as_json:
            print(f"note: building --task logits; a causal LM's default, --task text-generation, {why}", file=sys.stderr)
    if task == "text-generation":
        _build_generation(model, config, as_json=as_json, quiet=quiet)
        return
    if max_bits_per_weight is not None:
        raise UsageError("--max-bits-per-weight caps an INT4 text-generation build; this build is --task logits",
                         fix="drop --max-bits-per-weight, or build a causal LM with --task text-generation --int4")
    result = run_build(model, config=BuildConfig.of(config, precision=asked or "fp32", task="logits"),
                       progress=False if quiet else stderr(), command=["infopt", *sys.argv[1:]])
    if dry_run:
        _print_plan(result, as_json)
        return
    for row in result.manifest.candidates:
        if row.get("status") == "failed":
            print(f"warning: candidate {row['recipe']} failed and was left out: {row.get('reason')} "
                  f"(shipped {result.manifest.recipe['name']}; --strict makes this exit 3)", file=sys.stderr)
    if as_json:
        m = result.manifest
        chosen = next((c for c in m.candidates if c.get("chosen")), None)
        print_json({"passed": result.passed, "output": shown_path(result.output_dir),
                    "chosen": {"recipe": m.recipe["name"], "precision": m.precision, "backend": m.backend,
                               **({"speedup": chosen.get("speedup"), "p50_ms": chosen.get("p50_ms")} if chosen else {})},
                    "output_dir": str(result.output_dir), **m.to_json()})
    else:
        m = result.manifest
        chosen_sections = [summary(m), candidates_section(m), passes_section(m), *pass_sections(m), drift_section(m),
                           latency_section(m)]
        print_sections(stdout(), [s for s in chosen_sections if s is not None])
        stdout().print(f"wrote {shown_path(result.output_dir)}/ (report.md, report.html, manifest.json)", markup=False)
        if m.timings is not None:
            stdout().print(step_times.summary(m.timings.model_dump()), markup=False)
    if not result.passed:
        raise typer.Exit(1)


def _build_generation(model, config, *, as_json: bool, quiet: bool) -> None:
    from infopt.api.generation import build_generation
    from infopt.report.markdown import generation_section, passes_section, print_sections, summary

    result = build_generation(model, config, command=["infopt", *sys.argv[1:]], console=None if quiet else stderr())
    if isinstance(result, dict):
        _print_plan(result, as_json)
        return
    m = result.manifest
    if as_json:
        print_json({"passed": result.passed, "output": shown_path(result.output_dir), "output_dir": str(result.output_dir),
                    **m.to_json()})
    else:
        print_sections(stdout(), [summary(m), passes_section(m), generation_section(m)])
        servers = ", ".join(f"{path}/" for path in (m.artifacts.model_extra or {}).values() if str(path).startswith("servers/"))
        stdout().print(f"wrote {shown_path(result.output_dir)}/ ({servers}, report.md, manifest.json)", markup=False)
        if m.timings is not None:
            stdout().print(step_times.summary(m.timings.model_dump()), markup=False)
    if not result.passed:
        raise typer.Exit(1)


def _print_plan(plan: dict, as_json: bool) -> None:
    if as_json:
        print_json(plan)
        return
    dims = "; ".join(f"{k}={d['min']}:{d['opt']}:{d['max']}" for k, d in plan["inputs"]["dims"].items())
    inputs = ", ".join(f"{i['name']}:{i['dtype']}[{','.join(map(str, i['shape']))}]" for i in plan["inputs"]["inputs"])
    rows = [["source", f"{plan['source']} ({plan['format']})"], ["target", plan["target"]], ["inputs", inputs],
            ["dims", dims or "-"], ["validation data", plan["validation_data"]],
            ["calibration", plan["calibration"] or "-"], ["drift budget", plan["budget"] or "-"],
            ["output", shown_path(Path(plan["output"])) + (" (replaced)" if plan["replaces_existing"] else "")]]
    stdout().print(table(f"infopt build --dry-run: {plan['name']}", ["", ""], rows))
    rows = [[c["recipe"], " -> ".join(c["passes"]), f"skipped: {c['skipped']}" if c["skipped"] else "would build"]
            for c in plan["candidates"]]
    stdout().print(table("Candidates", ["recipe", "passes", ""], rows))
    stdout().print("nothing was written (--dry-run)", markup=False)
