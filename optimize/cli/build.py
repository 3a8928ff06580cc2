"""``infopt build``: model file in, validated output folder out."""

from __future__ import annotations

import inspect
import sys
from pathlib import Path
from typing import Annotated, Any, Optional, get_args

import typer

from infopt.api.build_config import BuildConfig, field_info, flag_of, flags_of, section_of_field
from infopt.api.flags import PRECISION_FLAGS
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


MODEL = Annotated[Path, typer.Argument(help="Model file: TorchScript .pt, torch.export .pt2, state_dict .pt, .onnx, a Hugging Face model folder, or a Hugging Face model id (org/name[@revision]) from the hub or its cache.")]
SHARED = {"inputs": o.Inputs, "dims": o.Dims, "val": o.Val, "model_class": o.ModelClass, "model_args": o.ModelArgs,
          "allow_pickle": o.AllowPickle, "batch_sizes": o.BatchSizes, "batch_mix": o.BatchMix}
"""settings whose option other commands take too: their shared declaration in ``options.py``"""
TEXT = {"recipe": Optional[Path], "output": Optional[Path], "calibration": Optional[str], "tokenizer": Optional[str]}
"""settings the command line reads as a path or text, whatever else the Python API takes"""
HELP = {"calib_method": lambda: f"{_choices(calibrators.names())}.",
        "int4_method": lambda: f"INT4: {_choices(['auto', *get_args(Int4MethodName)])} (default: gptq with --calib; "
                               "without, for text generation, gptq on text the model samples up to 250M parameters, "
                               "else rtn)."}
"""help that names what is registered now (a plugin's calibration method too)"""
CLI_ONLY = [
    *(inspect.Parameter(p, inspect.Parameter.KEYWORD_ONLY, default=False, annotation=Annotated[bool, typer.Option(
        f"--{p}", metavar="", help=f"Same as --precision {p}.")]) for p in PRECISION_FLAGS),
    *(inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=None, annotation=kind)
      for name, kind in (("max_abs", o.MaxAbs), ("min_cosine", o.MinCosine), ("min_top1", o.MinTop1),
                         ("min_sqnr_db", o.MinSqnr), ("max_p99_ms", o.MaxP99))),
    inspect.Parameter("allow_partial", inspect.Parameter.KEYWORD_ONLY, default=False, annotation=Annotated[bool, typer.Option(
        "--allow-partial", metavar="", hidden=True, help="The default now: ship the best candidate that passed when others failed.")]),
    inspect.Parameter("as_json", inspect.Parameter.KEYWORD_ONLY, default=False, annotation=o.Json),
    inspect.Parameter("quiet", inspect.Parameter.KEYWORD_ONLY, default=False, annotation=Annotated[bool, typer.Option(
        "--quiet", "-q", metavar="", help="No progress display.")]),
]
"""the options that are not one setting: the precision shortcuts, the limits (``thresholds``), the output's form"""


def _option(key: str) -> inspect.Parameter:
    """The option of the setting ``key``, as ``BuildConfig`` declares it: its flags, help, type and default."""
    info = field_info(key)
    kind = SHARED.get(key)
    if kind is None:
        plain = TEXT.get(key) or next((t for t in get_args(info.annotation) if t is not type(None)), info.annotation)
        extra = {"metavar": ""} if plain is bool else {}
        help_text = HELP[key]() if key in HELP else info.description
        kind = Annotated[plain if plain is bool or info.default is not None else Optional[plain],
                         typer.Option(*flags_of(key), help=help_text, **extra)]
    return inspect.Parameter(key, inspect.Parameter.KEYWORD_ONLY, default=info.default, annotation=kind)


def _signature() -> inspect.Signature:
    """``infopt build``'s parameters: the model, then every setting with a flag, the precision shortcuts after
    ``--precision``, and the options that are not one setting."""
    options = [_option(key) for key in section_of_field() if flags_of(key)]
    at = next(i for i, p in enumerate(options) if p.name == "precision") + 1
    return inspect.Signature([inspect.Parameter("model", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=MODEL),
                              *options[:at], *CLI_ONLY[:len(PRECISION_FLAGS)], *options[at:],
                              *CLI_ONLY[len(PRECISION_FLAGS):]])


def build(**given: Any) -> None:
    """Build, validate and emit a deployable artifact for a target."""
    from infopt.api import build as run_build
    from infopt.api import flags as api_flags
    from infopt.report.markdown import (
        candidates_section,
        drift_section,
        latency_section,
        pass_sections,
        passes_section,
        print_sections,
        summary,
    )

    model, as_json, quiet = given.pop("model"), given.pop("as_json"), given.pop("quiet")
    flags = {p: given.pop(p) for p in PRECISION_FLAGS}
    limits = {k: given.pop(k) for k in ("max_abs", "min_cosine", "min_top1", "min_sqnr_db", "max_p99_ms")}
    given.pop("allow_partial")
    task, precision = given["task"], given["precision"]
    if task not in (None, "logits", "text-generation"):
        raise UsageError(f"unknown --task {task!r}", fix="pass --task text-generation or --task logits (the default)")
    asked = api_flags.precision(flags, precision) if precision or any(flags.values()) else None  # else the recipe's
    config = BuildConfig.of(**{**given, "precision": asked, "batch_sizes": o.parse_batch_sizes(given["batch_sizes"]),
                               "batch_mix": o.parse_batch_mix(given["batch_mix"]),
                               "thresholds": o.thresholds(**limits) or None})
    api_flags.check_choices(config)  # an unknown --int4-method exits 2 here, before the model loads
    if task is None:
        from infopt.api.task_choice import default_task, logits_choices

        backend, recipe = config.deploy.backend, config.deploy.recipe
        logits_flags = [f"--{key}" for key in logits_choices(backend, recipe)]
        logits_flags += [flag_of(key) for key in config.logits_only_given() if key != "thresholds"]
        logits_flags += [f"--{key.replace('_', '-')}" for key, value in limits.items() if value is not None]
        task, why = default_task(model, precision=asked, target=config.deploy.target, val=config.validation.val,
                                 calib=config.calib.calibration, max_drift=config.validation.max_drift,
                                 logits_flags=logits_flags, recipe=recipe)
        if why and not quiet and not as_json:
            print(f"note: building --task logits; a causal LM's default, --task text-generation, {why}", file=sys.stderr)
    if task == "text-generation":
        _build_generation(model, config, as_json=as_json, quiet=quiet)
        return
    result = run_build(model, config=BuildConfig.of(config, precision=asked or "fp32", task="logits"),
                       progress=False if quiet else stderr(), command=["infopt", *sys.argv[1:]])
    if config.emit.dry_run:
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
    from infopt.api.orchestrator import build_generation
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


def with_plugin_settings() -> None:
    """``infopt build``'s options again, now with the settings the plugins' passes declare (the registries are
    filled); typer reads them when the command runs."""
    build.__signature__ = _signature()


build.__signature__ = _signature()  # typer reads the options from it
