"""What a build says about its chosen artifact's lineage, asking each pass's typed details
(``PassDetails.notes``: INT8's mode and choice, a TensorRT engine left to the server; the precision it shipped
in; the engine the server's config asks for); and a noisy machine's timings. Notes for the manifest and report;
nothing here names a pass."""

from __future__ import annotations

from infopt.core.pass_api import PASSES


def typed_details(lineage):
    """The typed details of each record of ``lineage`` that ran and recorded details of a declared type."""
    for record in lineage:
        step = PASSES.items.get(record.name)
        details = step.typed(record) if step is not None and step.details is not None else None
        if details is not None:
            yield details


def pass_notes(lineage) -> list[str]:
    """Every pass's own notes on what it did (``PassDetails.notes``), in the order the passes ran."""
    return [note for details in typed_details(lineage) for note in details.notes()]


def server_engine(lineage) -> dict | None:
    """What a pass of the lineage asks the server to build at load time (``PassDetails.server_engine``: a TensorRT
    engine left to Triton), or None."""
    return next((found for d in typed_details(lineage) if (found := d.server_engine()) is not None), None)


def shipped_precision(lineage) -> str | None:
    """The precision a pass left the artifact in when it is not the recipe's (``PassDetails.shipped_precision``: the
    INT8 pass shipping FP32 that measured faster here), or None."""
    return next((found for d in typed_details(lineage) if (found := d.shipped_precision()) is not None), None)


def noise_notes(timings) -> list[str]:
    """A warning when the blocks of a timing disagree: the machine was busy while it was measured."""
    noisy = sorted((t for t in timings if t.noisy), key=lambda t: -t.spread)
    if not noisy:
        return []
    worst = noisy[0]
    more = f" (and {len(noisy) - 1} more of the latency rows)" if len(noisy) > 1 else ""
    return [f"WARNING: the machine was noisy while timing: {worst.runner}'s {worst.blocks} block medians at batch "
            f"{worst.batch} lie {100 * worst.spread:.0f}% of its p50 apart{more}; the p50s and speedups are less "
            "certain. Time again on an idle machine, or compare two builds with `infopt gate`, which bounds the ratio"]
