"""What a build holds in memory grows with the weights by a bounded multiple of the checkpoint.

A Qwen2-shaped LM of about 100M parameters (random bf16 weights written shard by shard, ``tests/support/checkpoints.py``)
is built ``--task text-generation --int4`` from the CLI in a subprocess, and its peak RSS (the kernel's
``ru_maxrss`` of the build's process) is compared with that of the same build of the same architecture at two
layers and a tiny width: everything but the weights (the interpreter, torch, transformers, ONNX Runtime and the
build's own working memory). This is a memory bound, not a timing.

The goal is twice the checkpoint's bytes, and it is the bound here (:data:`BOUND`); the figures measured are in
``benchmarks/results/scale.md``. Each layer's mapped checkpoint pages are handed back once it is rounded (to INT4,
or to 8 bits for the layers llama.cpp's mixed strategy keeps). It fails when a change holds another copy of the
weights (a float32 copy of a bf16 checkpoint is two more).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.support.checkpoints import QWEN_COMMON, write_checkpoint
from tests.support.cli import ROOT
from tests.support.decoders import tokenizer_for

pytest.importorskip("onnxruntime_genai")
pytestmark = pytest.mark.slow

SHAPES = {
    "base": {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
             "num_key_value_heads": 2},
    "100m": {"hidden_size": 768, "intermediate_size": 2048, "num_hidden_layers": 12, "num_attention_heads": 12,
             "num_key_value_heads": 4},
}
"""the two sizes built: ``base`` (everything but the weights) and ``100m`` (about 100M parameters)"""

BOUND = 2.0
"""the growth allowed, in checkpoint bytes (the issue's goal)"""
MEASURE = """
import resource, subprocess, sys
code = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
print(code.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024)
sys.stderr.write(code.stderr[-3000:])
"""
"""runs a command and prints its exit status and peak RSS (bytes; ``ru_maxrss`` is in KiB on Linux)"""


def peak_build(folder, name: str) -> int:
    """Peak RSS of ``infopt build NAME --task text-generation --int4`` in ``folder``, its own process."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "INFOPT_CACHE_DIR": str(folder / "cache")}
    command = [sys.executable, "-m", "infopt.cli", "build", name, "--task", "text-generation", "--int4",
               "--max-drift", "top1=0,ppl_delta=100", "-o", f"dist-{name}", "-q"]  # random weights: nothing to judge
    proc = subprocess.run([sys.executable, "-c", MEASURE, *command], cwd=folder, env=env, capture_output=True,
                          text=True, timeout=900)
    code, peak = proc.stdout.split()
    assert code == "0", proc.stderr
    return int(peak)


def test_a_100m_parameter_lm_builds_int4_within_a_bounded_multiple_of_its_checkpoint_over_the_baseline(tmp_path):
    sizes = {}
    for name, shape in SHAPES.items():
        config = {**QWEN_COMMON, **shape, "vocab_size": 32000, "max_position_embeddings": 2048, "bos_token_id": 0,
                  "eos_token_id": 0, "tie_word_embeddings": True}
        sizes[name] = write_checkpoint(config, tmp_path / name)
        tokenizer_for(tmp_path / name)
    assert 95e6 < sizes["100m"] / 2 < 120e6  # bf16: two bytes a parameter
    peaks = {name: peak_build(tmp_path, name) for name in SHAPES}
    grown = peaks["100m"] - peaks["base"]
    manifest = json.loads((tmp_path / "dist-100m" / "manifest.json").read_text())
    assert manifest["validation"]["generation"]["reference_dtype"] == "bfloat16"
    print(f"grew {grown / sizes['100m']:.2f}x the checkpoint")
    assert grown <= BOUND * sizes["100m"], (f"peak {peaks['100m'] / 1e9:.2f} GB against {peaks['base'] / 1e9:.2f} GB "
                                        f"for the tiny shape: {grown / sizes['100m']:.2f}x the checkpoint")

