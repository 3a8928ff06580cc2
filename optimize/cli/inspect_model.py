"""``infopt inspect MODEL``: inputs, outputs, parameter count and op histogram."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from infopt.cli import options as o
from infopt.cli.output import print_json, stdout, table


def inspect(
    model: Annotated[Path, typer.Argument(help="Model file to inspect.")],
    inputs: o.Inputs = None,
    dims: o.Dims = None,
    val: o.Val = None,
    model_class: o.ModelClass = None,
    model_args: o.ModelArgs = None,
    allow_pickle: o.AllowPickle = False,
    top: Annotated[int, typer.Option("--top", help="How many ops of the histogram to show.")] = 20,
    as_json: o.Json = False,
) -> None:
    """Show what a model file holds."""
    from infopt.api.inspection import inspect_model

    info = inspect_model(model, inputs=inputs, dims=dims, model_class=model_class, model_args=model_args,
                         allow_pickle=allow_pickle, val=val)
    if as_json:
        print_json(info)
        return
    console = stdout()
    console.print(f"{info['path']}: {info['format']}, {info['parameters']:,} parameters", markup=False)
    rows = [["input", i["name"], i["dtype"], str(i["shape"])] for i in info["inputs"]["inputs"]]
    rows += [["output", x["name"], x["dtype"], f"{x['shape_at_opt']} (at opt)"] for x in info["outputs"]]
    console.print(table("Inputs and outputs", ["", "name", "dtype", "shape"], rows))
    ops = list(info["ops"].items())
    shown = [[op, n] for op, n in ops[:top]]
    if len(ops) > top:
        shown.append([f"... {len(ops) - top} more", sum(n for _, n in ops[top:])])
    console.print(table(f"Ops ({info['graph']})", ["op", "count"], shown))
