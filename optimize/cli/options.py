"""Option types shared by the commands, declared once."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

Json = Annotated[bool, typer.Option("--json", metavar="", help="Print the result as JSON on stdout (progress stays on stderr).")]
Inputs = Annotated[Optional[list[str]], typer.Option("--input", "-i", help='Input spec, e.g. "x:float32[batch,3,224,224]"; repeat per input.')]
Dims = Annotated[Optional[list[str]], typer.Option("--dim", help="Range of a symbolic dim as name=min:opt:max, e.g. batch=1:8:64.")]
ModelClass = Annotated[Optional[str], typer.Option("--model-class", help="pkg.module:Class to load a state_dict into.")]
ModelArgs = Annotated[Optional[str], typer.Option("--model-args", help="JSON object of keyword arguments for --model-class.")]
AllowPickle = Annotated[bool, typer.Option("--allow-pickle", metavar="", help="Allow unpickling a fully pickled nn.Module (runs code from the file).")]
Val = Annotated[Optional[Path], typer.Option("--val", help="Validation samples: a folder or file of .npy/.npz/.pt.")]
Key = Annotated[Optional[Path], typer.Option("--key", help="Ed25519 public key (PEM): refuse an output folder whose manifest.json.sig does not verify with it.")]
BatchSizes = Annotated[Optional[str], typer.Option("--batch-sizes", help="Comma-separated batch sizes to time, e.g. 1,8,32.")]
BatchMix = Annotated[Optional[str], typer.Option("--batch-mix", help="The batch sizes the model serves and the share of requests at each, e.g. 1:0.7,32:0.3: the sizes timed, and each one's weight when candidates and INT8 variants are compared.")]
MaxAbs = Annotated[Optional[float], typer.Option("--max-abs", help="Fail if max absolute drift exceeds this.")]
MinCosine = Annotated[Optional[float], typer.Option("--min-cosine", help="Fail if the smallest per-sample cosine is below this.")]
MinTop1 = Annotated[Optional[float], typer.Option("--min-top1", help="Fail if top-1 agreement is below this (classifiers).")]
MinSqnr = Annotated[Optional[float], typer.Option("--min-sqnr-db", help="Fail if SQNR in dB is below this.")]
MaxP99 = Annotated[Optional[float], typer.Option("--max-p99-ms", help="Fail if p99 latency in ms exceeds this at any batch size.")]


def parse_batch_sizes(text: str | None) -> list[int] | None:
    from infopt.core.errors import UsageError

    if not text:
        return None
    try:
        sizes = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise UsageError(f"--batch-sizes {text!r} is not a comma-separated list of ints", fix="for example --batch-sizes 1,8,32") from None
    if not sizes or any(s < 1 for s in sizes):
        raise UsageError(f"--batch-sizes {text!r} must list positive ints", fix="for example --batch-sizes 1,8,32")
    return sizes


def parse_batch_mix(text: str | None) -> dict[int, float] | None:
    """``1:0.7,32:0.3`` -> ``{1: 0.7, 32: 0.3}``; the values are checked (and scaled) where ``infopt.build``
    takes ``batch_mix``."""
    from infopt.core.errors import UsageError

    if not text:
        return None
    mix: dict[int, float] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        size, sep, share = part.partition(":")
        try:
            if not sep or int(size) in mix:
                raise ValueError
            mix[int(size)] = float(share)
        except ValueError:
            raise UsageError(f"--batch-mix {part!r} is not BATCH:SHARE (each batch size once)",
                             fix="write BATCH:SHARE pairs, e.g. --batch-mix 1:0.7,32:0.3") from None
    return mix


def thresholds(**values: float | None) -> dict[str, float]:
    """The limits given on the command line, each checked before any work: a limit that is not a number
    (``nan``, ``inf``) or lies outside its metric's range could never be met, or always would be."""
    import math

    from pydantic import ValidationError

    from infopt.core.errors import UsageError
    from infopt.core.recipe import DriftThresholds

    given = {k: v for k, v in values.items() if v is not None}
    drift = {k: v for k, v in given.items() if k in DriftThresholds.model_fields}
    try:
        DriftThresholds.model_validate(drift)
        problem = None
    except ValidationError as exc:
        first = exc.errors()[0]
        problem = (str(first["loc"][0]), first["msg"].lower())
    if problem is None and "max_p99_ms" in given and not (math.isfinite(given["max_p99_ms"]) and given["max_p99_ms"] > 0):
        problem = ("max_p99_ms", "input should be a finite number greater than 0")
    if problem:
        name, why = problem
        raise UsageError(f"--{name.replace('_', '-')} {given[name]}: {why}",
                         fix="give a finite limit in the metric's range, e.g. --max-abs 0.01, --min-cosine 0.99, "
                             "--min-top1 0.95, --max-p99-ms 20")
    return given
