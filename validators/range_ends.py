"""The ends of the dim ranges: a built model must take every size it was built for, not only the samples'.

:func:`range_ends` makes random inputs at the ends and runs the eager model on them (a model that
itself fails there is a bad ``--dim``, exit 2); :func:`check_range_ends` runs a built model on the
same inputs and raises :class:`RangeFailure`, naming the dims, when it fails or gives other shapes.
"""

from __future__ import annotations

import numpy as np

from infopt.core.errors import InputSpecError, first_line
from infopt.core.sample_inputs import id_high, random_feed


def range_ends(spec, reference, module) -> list[tuple[str, dict, list]]:
    """(dims, inputs, eager's output shapes) at each end: every dim at its min; every dim but the batch
    at its max (the batch at its min); the batch at its max (the others at their min). The largest
    batch and the longest sequence are not combined: for a language model's logits that one input
    alone can need more memory than the build has. The largest batch takes the other dims at their
    least, not their opt: it is a check that the batch range is taken, and at BERT-large's size a
    batch of 32 at sequence 128 took 10 s a runner, at sequence 1 a tenth of a second."""

    if not spec.dims:
        return []
    high = id_high(module)
    batch = spec.batch_symbol
    points = [{name: r.min for name, r in spec.dims.items()},
              {name: r.min if name == batch else r.max for name, r in spec.dims.items()}]
    if batch is not None:
        points.append({name: r.max if name == batch else r.min for name, r in spec.dims.items()})
    ends = []
    for dims in [p for i, p in enumerate(points) if p not in points[:i]]:
        feed = random_feed(spec, seed=7, int_high=high, **dims)
        where = ", ".join(f"{name}={size}" for name, size in dims.items())
        try:
            outputs = reference.run(feed)
        except Exception as exc:  # noqa: BLE001 - the model's own errors, of many types
            raise InputSpecError(f"the model itself fails at {where}: {type(exc).__name__}: {first_line(exc)}",
                                 where="the source model, run eagerly on random inputs at the ends of the --dim ranges",
                                 fix="give --dim ranges the model supports, e.g. --dim NAME=MIN:OPT:MAX") from exc
        ends.append((where, feed, [np.shape(o) for o in outputs]))
    return ends


class RangeFailure(Exception):
    """A built model that fails, or gives other shapes than eager, at an end of its dim range."""


def check_range_ends(runner, ends) -> None:
    """Raise RangeFailure, naming the dims, where ``runner`` fails or gives other shapes than eager."""
    for where, feed, shapes in ends:
        try:
            got = [np.shape(o) for o in runner.run(feed)]
        except Exception as exc:  # noqa: BLE001 - the runtime's own errors, of many types
            raise RangeFailure(f"it fails to run at {where}: {type(exc).__name__}: {first_line(exc)}") from exc
        if got != shapes:
            raise RangeFailure(f"at {where} it gives outputs of shapes {got}, eager {shapes}")
