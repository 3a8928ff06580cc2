"""Qwen2 and Qwen3: Llama's layout with biased query, key and value projections (Qwen2) or a norm on query and key
(Qwen3). ONNX Runtime GenAI runs both under their own model types."""

from infopt.exporters.families import Family, register

QWEN = register(Family("qwen", ("qwen2", "qwen3"), genai_native=True))
