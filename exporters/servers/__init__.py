"""Server layouts: Triton Inference Server model repository (TorchServe, KServe, vLLM later)."""
