"""Quantization: calibration, INT8 static/dynamic, SmoothQuant, INT4 weight-only (later issues)."""
