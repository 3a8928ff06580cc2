"""Typed manifests for tests of the parts that read one (servers, reports): every required field
filled with a plain value, and the fields a test is about given by it."""

from __future__ import annotations

import copy
from typing import Any

from infopt.core.manifest_schema import SCHEMA_VERSION, Manifest

BASE: dict[str, Any] = {
    "schema": SCHEMA_VERSION,
    "name": "m",
    "created": "2026-01-01T00:00:00+00:00",
    "source": {"path": "m.onnx", "format": "onnx", "sha256": "0" * 64},
    "target": {"name": "cpu", "device": "cpu", "description": "any x86-64 or arm64 CPU"},
    "precision": "fp32",
    "backend": "onnxruntime",
    "inputs": {"inputs": [{"name": "x", "dtype": "float32", "shape": ["batch", 4]}],
               "dims": {"batch": {"min": 1, "opt": 4, "max": 16}}},
    "outputs": [{"name": "y", "dtype": "float32", "shape": ["batch", 2]}],
    "recipe": {"name": "fp32-onnxruntime", "validation": {"drift": {}}},
    "passes": [],
    "validation": {"device": "cpu (onnxruntime CPUExecutionProvider)", "verdict": {"passed": True}},
    "versions": {},
    "artifacts": {"model": "model/model.onnx"},
    "files": {},
}


def _merge(into: dict[str, Any], parts: dict[str, Any]) -> dict[str, Any]:
    for key, value in parts.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict) and key not in REPLACED:
            _merge(into[key], value)
        else:
            into[key] = value
    return into


REPLACED = {"artifacts", "files", "inputs", "dims"}
"""sections a test gives whole rather than merged into the base"""


def typed_manifest(**parts: Any) -> Manifest:
    """A valid manifest: ``BASE`` with ``parts`` merged in (dicts key by key, except ``REPLACED``)."""
    return Manifest.model_validate(_merge(copy.deepcopy(BASE), parts))
