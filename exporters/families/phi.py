"""Phi-3: fused ``qkv_proj`` and ``gate_up_proj`` layers. ONNX Runtime GenAI runs it under its own model type."""

from infopt.exporters.families import Family, register

PHI = register(Family("phi", ("phi3",), genai_native=True))
