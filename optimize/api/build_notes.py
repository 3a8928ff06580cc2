"""What a build says about its chosen artifact's lineage: each pass's own notes (``Pass.notes``: INT8's mode
and choice, a TensorRT engine left to the server), the precision it shipped in, the engine the Triton config
asks the server to build, and a noisy machine's timings. Notes for the manifest and report."""

from __future__ import annotations

from infopt.core.registry import PASSES
from infopt.passes.lower.tensorrt_build import TensorRTDetails


def server_engine(lineage) -> TensorRTDetails | None:
    """What ``tensorrt_build`` recorded when it left the engine to the server, or None."""
    for record in lineage:
        details = TensorRTDetails.of(record.details) if record.name == "tensorrt_build" and not record.skipped else None
        if details is not None and details.engine == "server":
            return details
    return None


def triton_engine(server: TensorRTDetails | None) -> dict | None:
    """The Triton config's request for that engine: precision mode and workspace."""
    if server is None:
        return None
    return {"precision_mode": server.precision_mode, "workspace_bytes": int(server.workspace_gb * 2**30)}


def _typed(lineage):
    """(the pass, its typed details) of each record of ``lineage`` that ran and recorded details."""
    for record in lineage:
        step = PASSES.items.get(record.name)
        details = step.typed(record) if step is not None else None
        if details is not None:
            yield step, details


def pass_notes(lineage) -> list[str]:
    """Every pass's own notes on what it did (``Pass.notes``), in the order the passes ran."""
    return [note for step, details in _typed(lineage) if step.notes is not None for note in step.notes(details)]


def shipped_precision(lineage) -> str | None:
    """The precision a pass left the artifact in when it is not the recipe's (``Pass.shipped_precision``: the INT8
    pass shipping FP32 that measured faster here), or None."""
    for step, details in _typed(lineage):
        found = step.shipped_precision(details) if step.shipped_precision is not None else None
        if found is not None:
            return found
    return None


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
