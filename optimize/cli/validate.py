"""``infopt validate DIST``: re-check an output folder against its manifest."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from infopt.cli import options as o
from infopt.cli.output import print_json, stderr, stdout, table


def validate(
    dist: Annotated[Path, typer.Argument(help="An output folder written by `infopt build`.")],
    batch_sizes: o.BatchSizes = None,
    max_abs: o.MaxAbs = None,
    min_cosine: o.MinCosine = None,
    min_top1: o.MinTop1 = None,
    min_sqnr_db: o.MinSqnr = None,
    max_p99_ms: o.MaxP99 = None,
    key: o.Key = None,
    as_json: o.Json = False,
) -> None:
    """Check file hashes, re-run the model on the stored samples, time it, and give the verdict."""
    from infopt.api import validate as run_validate

    with stderr().status("validating"):
        result = run_validate(dist, batch_sizes=o.parse_batch_sizes(batch_sizes),
                              thresholds=o.thresholds(max_abs=max_abs, min_cosine=min_cosine, min_top1=min_top1,
                                                      min_sqnr_db=min_sqnr_db, max_p99_ms=max_p99_ms), key=key)
    verdict = result["verdict"]
    if as_json:
        print_json(result)
    else:
        console = stdout()
        console.print(f"{result['name']}: files {'ok' if result['integrity'] == 'ok' else 'CHANGED'}", markup=False)
        if "drift" in result:
            rows = [[n, f"{m['max_abs']:.4g}", f"{m['cosine_min']:.6f}", f"{m['sqnr_db']:.1f}", "-" if m["top1"] is None else f"{m['top1']:.4f}"]
                    for n, m in result["drift"]["outputs"].items()]
            console.print(table("Drift against the stored reference", ["output", "max_abs", "cosine (min)", "SQNR dB", "top-1"], rows))
            rows = [[t["batch"], f"{t['p50_ms']:.3f}", f"{t['p90_ms']:.3f}", f"{t['p99_ms']:.3f}", f"{t['throughput']:.1f}"]
                    for t in result["latency"]]
            console.print(table("Latency (ms)", ["batch", "p50", "p90", "p99", "samples/s"], rows))
        if "generation" in result:
            from infopt.report.markdown import ppl_text, top1_text

            found = result["generation"]
            greedy, forced = found["greedy"], found["teacher_forced"]
            rows = [["greedy tokens equal", f"{greedy['equal']}/{greedy['prompts']} prompts"],
                    ["top-1 agreement (teacher-forced)", top1_text(forced)],
                    ["perplexity increase", f"{ppl_text(forced)} ({forced['ppl']:.4g} vs {forced['ppl_reference']:.4g})"],
                    *([f"TTFT {r['prompt_tokens']} tokens", f"{r['p50_ms']:.2f} ms"] for r in found["ttft"]),
                    *([f"TPOT batch {r['batch']}", f"{r['p50_ms']:.2f} ms ({r['tokens_per_s']:.1f} tokens/s)"]
                      for r in found["tpot"])]
            console.print(table(f"Generation against the stored reference (budgets: {found['budgets']})",
                                ["figure", "measured"], rows))
        console.print("PASS" if verdict["passed"] else "FAIL: " + "; ".join(verdict["reasons"]), markup=False,
                      style="bold green" if verdict["passed"] else "bold red")
    if not verdict["passed"]:
        raise typer.Exit(1)
