"""PT2E static INT8 compiled with Inductor (freezing=True), judged by the drift validator.

The held-out digits (never trained on, never calibrated on) are the evaluation set; calibration
uses the training split. One converted model and one compiled program are shared by the module,
because an Inductor compile takes seconds on two cores.
"""

from __future__ import annotations

import copy
import shutil
from collections import Counter

import numpy as np
import pytest

pytest.importorskip("torchao", reason="PT2E INT8 needs torchao (pip install 'torchao>=0.18')")
pytestmark = [
    pytest.mark.skipif(shutil.which("g++") is None, reason="Inductor on CPU compiles C++ kernels and g++ is not installed"),
    pytest.mark.filterwarnings("ignore:To copy construct from a tensor:UserWarning"),  # inside torch's mkldnn lowering
]

import torch  # noqa: E402

from infopt.core.recipe import DriftThresholds, Validation  # noqa: E402
from infopt.quantize.pt2e import InductorRunner, compile_inductor, input_names, quantize_pt2e  # noqa: E402
from infopt.runtime.runner import TorchRunner  # noqa: E402
from infopt.validators.drift import compare  # noqa: E402
from infopt.validators.verdict import judge  # noqa: E402

BATCH = 360
"""The held-out split is 360 digits: one static batch, so each candidate compiles once."""

VALIDATION = Validation(drift=DriftThresholds(min_top1=0.99, min_mean_cosine=0.99, min_sqnr_db=20.0))
"""One gate for every candidate: the correct INT8 program must pass it, a miscompiled one must not."""

Q = torch.ops.quantized_decomposed


def _ops(graph_module) -> Counter:
    return Counter(n.target for n in graph_module.graph.nodes if n.op == "call_function")


def _compile(graph_module, x: np.ndarray) -> tuple[InductorRunner, dict[str, int]]:
    """Compile with freezing and return the runner and the Inductor pattern counters of that compile."""
    from torch._dynamo.utils import counters

    counters["inductor"].clear()
    compiled = compile_inductor(graph_module, (x,), freezing=True)
    fired = dict(counters["inductor"])
    return InductorRunner(compiled, input_names(graph_module), ("logits",)), fired


@pytest.fixture(scope="module")
def heldout(digits):
    model, data = digits
    x, y = data["val"]
    assert x.shape[0] == BATCH
    reference = TorchRunner(model, ("x",), ("logits",)).run({"x": x})
    return model, x, y, reference


@pytest.fixture(scope="module")
def converted(digits, heldout):
    model, data = digits
    xtr, _ = data["train"]
    _, x, _, _ = heldout
    calibration = [{"x": xtr[i:i + BATCH]} for i in range(0, len(xtr) - BATCH + 1, BATCH)]
    return quantize_pt2e(model, (x[:BATCH],), calibration, per_channel=True)


@pytest.fixture(scope="module")
def compiled(converted, heldout):
    _, x, _, _ = heldout
    return _compile(converted, x)


def _drift_verdict(runner, heldout):
    _, x, _, reference = heldout
    report = compare([reference], [runner.run({"x": x})], ("logits",), source="digits held-out split")
    return report, judge(VALIDATION, report.worst, [])


def test_int8_graph_and_accuracy(converted, compiled, heldout):
    """The converted graph holds real q/dq ops, Inductor fuses them into int8 kernels, and held-out
    top-1 accuracy stays within one point of the FP32 eager model."""
    ops = _ops(converted)
    assert ops[Q.quantize_per_tensor.default] >= 4, ops  # input, two conv outputs, pool, head input
    assert ops[Q.dequantize_per_tensor.default] == ops[Q.quantize_per_tensor.default], ops
    assert ops[Q.dequantize_per_channel.default] == 3, ops  # two convs and the linear head
    for node in converted.graph.nodes:
        if node.target == Q.dequantize_per_channel.default:
            weight = getattr(converted, node.args[0].target)
            assert weight.dtype == torch.int8, node.args[0].target
    assert torch.ops.aten.conv2d.default in ops and torch.ops.aten.linear.default in ops

    runner, fired = compiled
    # freezing=True is what lets Inductor prepack the int8 weights into oneDNN qconv/qlinear
    assert fired.get("qconv_weight_prepack_matcher_count") == 2, fired
    assert fired.get("qlinear_weight_prepack_matcher_count") == 1, fired

    _, x, y, reference = heldout
    fp32 = float((reference[0].argmax(1) == y).mean())
    int8 = float((runner.run({"x": x})[0].argmax(1) == y).mean())
    assert fp32 >= 0.95
    assert int8 >= fp32 - 0.01, f"PT2E INT8 top-1 {int8:.4f} vs FP32 eager {fp32:.4f}"


def test_correct_compile_passes_the_gate(compiled, heldout):
    runner, _ = compiled
    report, verdict = _drift_verdict(runner, heldout)
    assert report.samples == BATCH
    assert [c.name for c in verdict.checks] == ["min_mean_cosine", "min_sqnr_db", "min_top1"]
    assert all(c.measured is not None for c in verdict.checks)
    assert verdict.passed, verdict.reasons


def _corrupt_weight_scale(converted, layer: int, factor: float):
    """A copy of ``converted`` whose ``layer``-th per-channel weight scale constant is multiplied by
    ``factor``: the int8 weights stay right, the scale used to dequantize them is wrong."""
    bad = copy.deepcopy(converted)
    nodes = [n for n in bad.graph.nodes if n.target == Q.dequantize_per_channel.default]
    name = nodes[layer].args[1].target
    with torch.no_grad():
        getattr(bad, name).mul_(factor)
    return bad, name


@pytest.mark.parametrize("layer, caught_by", [
    # second conv: the error passes through ReLU, requantization and pooling, and flips predictions
    (1, {"min_top1", "min_mean_cosine", "min_sqnr_db"}),
    # linear head: every logit's weight term doubles; argmax and direction barely move, so only
    # SQNR sees it. A gate with only top-1 and cosine thresholds would ship this program.
    (2, {"min_sqnr_db"}),
])
def test_drift_gate_catches_injected_miscompile(converted, compiled, heldout, layer, caught_by):
    """The drift validator fails a compiled INT8 program that computes with a wrong scale.

    Compiling a PT2E INT8 model with Inductor freezing=True has been seen to give wrong outputs
    for some calibration sets. This test does NOT reproduce that upstream bug: it injects a fault
    of the same kind (a quantization scale constant corrupted before compiling, which freezing
    folds into the prepacked weights) so that the compiled program silently computes with wrong
    scales, and checks that ``compare`` + ``judge`` on real held-out digits refuse it while the
    correctly compiled program passes the same gate.
    """
    bad, name = _corrupt_weight_scale(converted, layer, 2.0)
    runner, fired = _compile(bad, heldout[1])
    assert fired.get("qconv_weight_prepack_matcher_count") == 2, fired  # same int8 lowering as the good one

    report, verdict = _drift_verdict(runner, heldout)
    assert not verdict.passed, f"corrupted {name} was not caught: {report.worst}"
    failed = {c.name for c in verdict.checks if not c.passed}
    assert failed == caught_by, verdict.reasons
    for metric in caught_by:
        assert any(r.startswith(f"{metric}:") for r in verdict.reasons), verdict.reasons

    good_report, good_verdict = _drift_verdict(compiled[0], heldout)
    assert good_verdict.passed, good_verdict.reasons
    assert report.worst["sqnr_db"] < good_report.worst["sqnr_db"] - 20.0
