"""Helpers for pass tests: capture a module, run a program, save and check it as ONNX; a tiny BERT and a
padded batch for it."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import torch

from infopt.core.artifact import Artifact
from infopt.core.inputspec import InputSpec
from infopt.core.pass_api import PassContext, get_pass
from infopt.core.target import get_target
from infopt.exporters.torch_export import export_module
from infopt.passes.lower.onnx_export import export_onnx


def capture(module: torch.nn.Module, spec: str, dims=()) -> Artifact:
    s = InputSpec.parse([spec] if isinstance(spec, str) else spec, list(dims))
    program = export_module(module.eval(), s)
    return Artifact("exported", s, obj=program, output_names=("output",))


def ops(program) -> Counter:
    return Counter(str(n.target) for n in program.graph.nodes if n.op == "call_function")


def run_pass(name: str, artifact: Artifact, tmp_path: Path, **options):
    definition = get_pass(name)
    return definition.run(artifact, definition.parse_options(options), PassContext(get_target("cpu"), tmp_path))


def saved_and_checked(program, spec: InputSpec, path: Path) -> onnx.ModelProto:
    """Serialize the program as ONNX and run the full checker on the file."""
    export_onnx(program, path, spec.names, ("output",))
    onnx.checker.check_model(str(path), full_check=True)
    return onnx.load(str(path))


class TinyBert(torch.nn.Module):
    """A two-layer BERT (hidden 32, 4 heads) with seeded random weights, returning the last hidden state;
    ``attention`` is transformers' attention implementation ("sdpa" or "eager")."""

    def __init__(self, attention: str):
        super().__init__()
        import transformers

        config = transformers.BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                         intermediate_size=64, max_position_embeddings=64, attn_implementation=attention)
        torch.manual_seed(0)
        self.bert = transformers.BertModel(config, add_pooling_layer=False).eval()

    def forward(self, input_ids, attention_mask):
        return self.bert(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state


def padded_batch(seq: int = 16):
    rng = np.random.default_rng(1)
    ids = rng.integers(1, 100, (4, seq)).astype(np.int64)
    mask = np.zeros((4, seq), np.int64)
    for row, real in enumerate((seq, 5, 1, 0)):  # full, short, one token, none at all
        mask[row, :real] = 1
    return {"input_ids": ids, "attention_mask": mask}
