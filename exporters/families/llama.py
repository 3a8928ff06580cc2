"""Llama and the families built like it (SmolLM2 and SmolLM3, Mistral, Granite, OLMo, Nemotron): rotate-half
rotary, grouped-query attention, RMSNorm. ONNX Runtime GenAI runs each under its own model type."""

from infopt.exporters.families import Family, register

LLAMA = register(Family("llama", ("llama", "smollm3", "mistral", "granite", "olmo", "nemotron"), genai_native=True))
