"""``infopt gate CANDIDATE --baseline BASELINE``: fail a release that got less accurate or slower."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from infopt.cli import options as o
from infopt.cli.output import print_json, stderr, stdout, table


def gate(
    candidate: Annotated[Path, typer.Argument(help="The new build: an `infopt build` output folder or its manifest.json.")],
    baseline: Annotated[Path, typer.Option("--baseline", "-b", help="The released build to compare with (folder or manifest.json).")],
    val: o.Val = None,
    gate_file: Annotated[Optional[Path], typer.Option("--gate-file", "-g", help="Thresholds in YAML (sections reference, baseline, task, latency, generation; max_size_ratio, max_memory_ratio).")] = None,
    labels: Annotated[Optional[str], typer.Option("--labels", help="Key of the labels in the --val sample files (default: labels).")] = None,
    task_metric: Annotated[Optional[str], typer.Option("--task-metric", help="accuracy, topK (e.g. top5), mse, or module:function(outputs, labels).")] = None,
    max_task_drop: Annotated[Optional[float], typer.Option("--max-task-drop", help="Fail if the candidate's task score is this much worse than the baseline's (default 0.01).")] = None,
    min_task: Annotated[Optional[float], typer.Option("--min-task", help="Fail if the candidate's task score is worse than this.")] = None,
    min_cosine: Annotated[Optional[float], typer.Option("--min-cosine", help="Fail if the candidate's smallest cosine to the eager reference is below this.")] = None,
    min_baseline_cosine: Annotated[Optional[float], typer.Option("--min-baseline-cosine", help="Fail if the candidate's smallest cosine to the baseline's outputs is below this.")] = None,
    min_baseline_top1: Annotated[Optional[float], typer.Option("--min-baseline-top1", help="Fail if top-1 agreement with the baseline is below this.")] = None,
    max_latency_ratio: Annotated[Optional[float], typer.Option("--max-latency-ratio", help="Fail if candidate/baseline latency is above this with the stated confidence (default 1.10).")] = None,
    confidence: Annotated[Optional[float], typer.Option("--confidence", help="Confidence for the latency bound (default 0.95).")] = None,
    trials: Annotated[Optional[int], typer.Option("--trials", help="Interleaved latency trials per batch size (default 15).")] = None,
    batch_sizes: o.BatchSizes = None,
    max_ppl_increase: Annotated[Optional[float], typer.Option("--max-ppl-increase", help="Text-generation builds: fail if the candidate's perplexity on --val text is this much above the baseline's, relative (0.02 is 2 %).")] = None,
    max_size_ratio: Annotated[Optional[float], typer.Option("--max-size-ratio", help="Fail if the candidate's model files are this many times the baseline's.")] = None,
    max_memory_ratio: Annotated[Optional[float], typer.Option("--max-memory-ratio", help="Fail if the candidate's peak memory is this many times the baseline's.")] = None,
    no_memory: Annotated[bool, typer.Option("--no-memory", metavar="", help="Skip the peak-memory measurement (two child processes).")] = False,
    junit: Annotated[Optional[Path], typer.Option("--junit", help="Write the checks as JUnit XML here.")] = None,
    summary: Annotated[Optional[Path], typer.Option("--summary", help="Write a Markdown summary here (also appended to $GITHUB_STEP_SUMMARY when set).")] = None,
    key: o.Key = None,
    as_json: o.Json = False,
) -> None:
    """Run the candidate and the baseline on the same inputs; exit 1 with the reasons if the
    candidate is less accurate, drifts, or is slower, larger or hungrier than the limits allow."""
    from infopt.api.gating import gate as run_gate
    from infopt.report.gate import HEADERS, check_writable, headline, rows, write_outputs
    from infopt.validators.gate_config import load_gate_file, with_flags

    config = with_flags(load_gate_file(gate_file), task__labels=labels, task__metric=task_metric, task__max_drop=max_task_drop,
                        task__min=min_task, reference__min_cosine=min_cosine, baseline__min_cosine=min_baseline_cosine,
                        baseline__min_top1=min_baseline_top1, latency__max_ratio=max_latency_ratio,
                        latency__confidence=confidence, latency__trials=trials,
                        latency__batch_sizes=o.parse_batch_sizes(batch_sizes), max_size_ratio=max_size_ratio,
                        generation__max_ppl_increase=max_ppl_increase,
                        max_memory_ratio=max_memory_ratio)
    check_writable(junit, "--junit")
    check_writable(summary, "--summary")
    with stderr().status("gate: starting") as status:
        result = run_gate(candidate, baseline, config=config, val=val, memory=not no_memory, key=key,
                          progress=lambda msg: status.update(f"gate: {msg}"))
    write_outputs(result, junit, summary)
    if as_json:
        print_json(result.to_json())
    else:
        console = stdout()
        console.print(table(headline(result), HEADERS, rows(result)))
        for note in result.notes:
            console.print(f"  {note}", style="dim", markup=False)
        if result.passed:
            console.print("PASS", style="bold green")
        else:
            console.print("FAIL:\n  " + "\n  ".join(result.reasons), style="bold red", markup=False)
    if not result.passed:
        raise typer.Exit(1)
