"""Package data: target declarations (``targets.yaml``) and pass pipelines (``pipelines/``)."""

from __future__ import annotations

from pathlib import Path

RECIPES_DIR = Path(__file__).resolve().parent
TARGETS_FILE = RECIPES_DIR / "targets.yaml"
PIPELINES_DIR = RECIPES_DIR / "pipelines"
