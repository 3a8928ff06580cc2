"""Gemma, Gemma 2 and Gemma 3's text model: a scaled embedding; Gemma 2's attention and final logits are
soft-capped, and Gemma 2 and 3 mix sliding-window layers in. The config declares both, and the decoder reads them
from it. ONNX Runtime GenAI runs each under its own model type."""

from infopt.exporters.families import Family, register

GEMMA = register(Family("gemma", ("gemma", "gemma2", "gemma3_text"), genai_native=True))
