"""A decoder captured with its first two layers and stamped to all of them (``exporters/layer_probe.py``,
``passes/lower/onnx_stamp.py``) computes what the decoder exported whole computes: the same ONNX Runtime
outputs, for transformers' decoder families, in float and with INT4 layers; and a model whose layers are not
alike is captured whole."""

from __future__ import annotations

import dataclasses
from collections import Counter

import numpy as np
import pytest

from tests.support.decoders import DECODERS, EVERY_RUN, LAYERS, SENTENCES, decoder, with_layers

transformers = pytest.importorskip("transformers")
ort = pytest.importorskip("onnxruntime")


def export_both(lm, folder, unfused: bool = False):
    """(whole.onnx, stamped.onnx, layout) of the decoder of ``lm``, as capture_kv_decoder captures it (or with
    attention as transformers writes it)."""
    from infopt.exporters import kv_attention, kv_decoder, layer_probe
    from infopt.passes.lower.onnx_export import export_onnx

    layout = kv_decoder.cache_layout(lm)
    length = kv_decoder.context_length(lm.config)
    fused = kv_attention.fusable(lm, length) is None and not unfused
    rotary = kv_attention.rotary_caches(lm, length, layout.head_size) if fused else None
    rotary = None if isinstance(rotary, str) else rotary
    whole = kv_decoder.capture(lm, layout, fused=fused, rotary=rotary)
    export_onnx(whole, folder / "whole.onnx", layout.input_names(), layout.output_names())
    path, _ = layer_probe.plan(lm, layout.layers)
    probe = dataclasses.replace(layout, layers=layer_probe.PROBE_LAYERS)
    with layer_probe.truncated(lm, path):
        program = kv_decoder.capture(lm, probe, fused=fused, rotary=rotary)
    stamp = layer_probe.LayerStamp(lm, path, layout.layers, probe.input_names(), probe.output_names(), lambda: whole)
    export_onnx(program, folder / "stamped.onnx", stamp.input_names, stamp.output_names, stamp=stamp)
    return folder / "whole.onnx", folder / "stamped.onnx", layout


def outputs(path, layout, batch: int, steps: int, past: int) -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    feeds = {"input_ids": rng.integers(0, 512, (batch, steps)).astype(np.int64),
             "attention_mask": np.ones((batch, past + steps), np.int64)}
    for name in layout.input_names()[2:]:
        feeds[name] = rng.standard_normal((batch, layout.kv_heads, past, layout.head_size)).astype(np.float32)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    assert [i.name for i in session.get_inputs()] == layout.input_names()
    assert [o.name for o in session.get_outputs()] == layout.output_names()
    return session.run(None, feeds)


def assert_same(whole, stamped, layout):
    for batch, steps, past in ((1, 6, 0), (2, 1, 5)):  # a prompt, then a step with a cache
        for a, b in zip(outputs(whole, layout, batch, steps, past), outputs(stamped, layout, batch, steps, past)):
            np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("family", [pytest.param(f, marks=() if f in EVERY_RUN else pytest.mark.zoo) for f in DECODERS])
def test_a_stamped_decoder_computes_what_the_decoder_exported_whole_computes(family, tmp_path):
    import onnx

    from infopt.passes.onnx.fuse_matmuls import siblings

    lm = with_layers(family, 5)
    whole, stamped, layout = export_both(lm, tmp_path)
    assert layout.layers == 5
    assert_same(whole, stamped, layout)
    # the same ops, but for the sibling projections packed as written: one MatMul (one bias Add) and a Split each
    whole_model = onnx.load(str(whole))
    want = Counter(n.op_type for n in whole_model.graph.node)
    for matmuls, adds in siblings(whole_model):
        want.update({"MatMul": 1 - len(matmuls), "Split": 1, "Add": 1 - len(adds) if adds[0] is not None else 0})
    stamped_model = onnx.load(str(stamped))
    assert Counter(n.op_type for n in stamped_model.graph.node) == +want
    assert siblings(stamped_model) == []


@pytest.mark.slow
def test_unfused_attention_is_stamped_with_each_layers_cache_concatenated(tmp_path):
    """Unfused, the graph reads the cache's length from some layer's past: a shape, shared by every layer."""
    whole, stamped, layout = export_both(with_layers("llama", 4), tmp_path, unfused=True)
    assert_same(whole, stamped, layout)


@pytest.mark.slow
def test_int4_layers_are_stamped_with_each_layers_own_packed_weights(tmp_path):
    import onnx

    from infopt.quantize.int4_config import Int4Config
    from infopt.quantize.weight_only import quantize_int4

    lm = with_layers("llama", 4)
    quantize_int4(lm.model, Int4Config(method="rtn", group_size=32))
    whole, stamped, layout = export_both(lm, tmp_path)
    assert_same(whole, stamped, layout)
    graph = onnx.load(str(stamped)).graph
    assert [n.op_type for n in graph.node].count("MatMulNBits") == 4 * 7
    # every layer reads its own packed weights: no two MatMulNBits read the same codes
    weights = {i.name: onnx.numpy_helper.to_array(i) for i in graph.initializer}
    codes = {weights[n.input[1]].tobytes() for n in graph.node if n.op_type == "MatMulNBits"}
    assert len(codes) == 4 * 7


def test_layers_not_built_alike_are_captured_whole():
    import torch

    from infopt.exporters.layer_probe import plan

    assert plan(with_layers("llama", 2), 2) == "2 layers: captured whole"
    assert isinstance(plan(with_layers("llama", 4), 4), tuple)
    windowed = transformers.Qwen2ForCausalLM(transformers.Qwen2Config(
        vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64, use_sliding_window=True, sliding_window=16,
        max_window_layers=2))
    assert plan(windowed, 4) == "its layers are of 2 types (full_attention, sliding_attention)"
    wider = with_layers("llama", 4)
    wider.model.layers[2].mlp.up_proj = torch.nn.Linear(64, 256, bias=False)
    assert plan(wider, 4) == "layer 2 is built unlike layer 0"


@pytest.mark.slow
def test_a_probe_whose_layers_do_not_match_is_exported_whole_and_the_build_says_so(tmp_path, monkeypatch):
    """Where the exported layers turn out unlike (here made to), the build captures the decoder whole and ships."""
    import json

    from infopt.api.orchestrator import build_generation
    from infopt.core.errors import CaptureError
    from infopt.passes.lower import onnx_stamp

    def unlike(*args, **kwargs):
        raise CaptureError("the probe's layers differ: 70 nodes in layer 0, 69 in layer 1")

    monkeypatch.setattr(onnx_stamp, "stamp", unlike)
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("\n".join(SENTENCES.read_text().splitlines()[400:404]) + "\n")
    result = build_generation(decoder(tmp_path, "llama"), output=tmp_path / "whole", val=prompts)
    manifest = json.loads((result.output_dir / "manifest.json").read_text())
    assert manifest["validation"]["generation"]["greedy"]["equal"] == 4
    export = manifest["passes"][1]
    assert export["name"] == "onnx_export" and export["details"]["stamped_layers"] is None
    assert any(n.startswith("not stamped (the probe's layers differ: 70 nodes in layer 0") for n in export["notes"])


def test_the_cache_layout_is_read_on_fake_tensors_and_for_real_where_a_forward_needs_values():
    from torch._subclasses.fake_tensor import FakeTensor

    from infopt.exporters import kv_decoder

    lm = with_layers("llama")
    passes = []  # per forward pass: whether it ran on fake tensors

    class Recorded(type(lm)):
        def forward(self, *args, **kwargs):
            passes.append(isinstance(kwargs["input_ids"], FakeTensor))
            return super().forward(*args, **kwargs)

    class Branching(type(lm)):  # a forward that reads a value: fake tensors cannot say which way it goes
        def forward(self, *args, **kwargs):
            passes.append(isinstance(kwargs["input_ids"], FakeTensor))
            if kwargs["input_ids"].sum() < 0:
                raise AssertionError("token ids are never negative")
            return super().forward(*args, **kwargs)

    expected = kv_decoder.CacheLayout(layers=LAYERS, kv_heads=lm.config.num_key_value_heads,
                                      head_size=lm.config.head_dim, vocab=lm.config.vocab_size)
    assert kv_decoder.cache_layout(Recorded(lm.config).eval()) == expected
    assert passes == [True]  # one pass, shapes only
    passes.clear()
    branching = Branching(lm.config).eval()
    assert kv_decoder.cache_layout(branching) == expected
    assert passes == [True, False]  # the fake pass gave up, the real one answered
    assert not any(isinstance(t, FakeTensor) for t in [*branching.parameters(), *branching.buffers()])
