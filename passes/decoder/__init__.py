"""The passes of a causal LM's decoder with its KV cache (``--task text-generation``): its capture, the fusions
and plumbing of the exported graph, the output head's INT4, and the ONNX Runtime GenAI folder."""
