"""Counting an ONNX graph's operators."""

from __future__ import annotations

from pathlib import Path

import onnx


def ops(path: Path) -> dict[str, int]:
    """How many nodes of each op type the graph in ``path`` holds (its external data left unread)."""
    counts: dict[str, int] = {}
    for node in onnx.load(str(path), load_external_data=False).graph.node:
        counts[node.op_type] = counts.get(node.op_type, 0) + 1
    return counts
