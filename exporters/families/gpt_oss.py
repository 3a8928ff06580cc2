"""gpt-oss: attention with learned sink logits and mixture-of-experts layers. Its decoder keeps the model's own
attention (ONNX Runtime's GroupQueryAttention has no sinks) and runs as GenAI's generic ``decoder``."""

from infopt.exporters.families import Family, register

GPT_OSS = register(Family("gpt_oss", ("gpt_oss",), attention_sinks=True))
