"""CUDA graphs per batch bucket: which graph a call replays, how inputs are padded and outputs cut back.

This machine has no GPU, so the bucketing runs over a stand-in for the recording (``cpu_capture``):
like a CUDA graph it fixes the input and output buffers at capture and recomputes into them on
replay, so a wrong buffer, a missing copy or a wrong slice shows as a wrong number. The same tests
run with the real ``torch.cuda.CUDAGraph`` where there is a GPU (``test_real_cuda_graphs``).
"""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils._pytree import tree_leaves

from infopt.runtime.cuda_graphs import GraphedCallable, bucket_for, buckets_up_to, cuda_capture
from infopt.runtime.runner import TorchRunner


class Recorder:
    """Records like a CUDA graph: buffers fixed at capture, replay recomputes into them."""

    def __init__(self):
        self.captured: list[tuple] = []

    def __call__(self, fn, static_inputs):
        outputs = fn(*static_inputs)
        self.captured.append(tuple(tuple(t.shape) for t in static_inputs))

        def replay():
            for buffer, fresh in zip(tree_leaves(outputs), tree_leaves(fn(*static_inputs))):
                buffer.copy_(fresh)

        return replay, outputs


class TwoHeads(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.body = nn.Sequential(nn.Linear(6, 16), nn.ReLU())
        self.a, self.b = nn.Linear(16, 3), nn.Linear(16, 2)

    def forward(self, x, mask):
        h = self.body(x) * mask
        return self.a(h), {"b": self.b(h)}


def test_buckets_are_powers_of_two_capped_by_the_largest_batch():
    assert [bucket_for(b, None) for b in (1, 2, 3, 5, 9, 16, 17)] == [1, 2, 4, 8, 16, 16, 32]
    assert bucket_for(9, 12) == 12 and bucket_for(13, 12) == 16
    assert buckets_up_to(12) == [1, 2, 4, 8, 12]


def test_every_batch_size_replays_its_buckets_graph_with_eager_results():
    model, recorder = TwoHeads().eval(), Recorder()
    graphed = GraphedCallable(model, capture=recorder)
    for batch in (3, 1, 7, 2, 5, 8, 4, 3):
        x, mask = torch.randn(batch, 6), torch.rand(batch, 16)
        got_a, got = graphed(x, mask)
        want_a, want = model(x, mask)
        assert got_a.shape == (batch, 3) and got["b"].shape == (batch, 2)
        torch.testing.assert_close(got_a, want_a)
        torch.testing.assert_close(got["b"], want["b"])
    assert sorted(shape[0][0] for shape in recorder.captured) == [1, 2, 4, 8]
    assert graphed.eager_calls == 0
    assert graphed.describe() == "CUDA graphs captured per batch bucket (1, 2, 4, 8), replayed per call"


def test_outputs_without_the_batch_first_are_captured_per_exact_batch():
    model = nn.Linear(4, 4).eval()
    recorder = Recorder()
    graphed = GraphedCallable(lambda x: model(x).sum(0), capture=recorder)
    for batch in (3, 5, 3):
        x = torch.randn(batch, 4)
        torch.testing.assert_close(graphed(x), model(x).sum(0))
    assert not graphed.pad_batch
    assert sorted({shape[0][0] for shape in recorder.captured}) == [3, 4, 5], "4 was the padded try, then 3 and 5 exactly"
    assert "per exact batch size (3, 5)" in graphed.describe()


def test_new_shapes_past_the_limit_run_eagerly():
    model = nn.Linear(8, 2).eval()
    graphed = GraphedCallable(model, capture=Recorder(), max_graphs=2)
    for seq in (3, 4, 5, 6):
        x = torch.randn(2, seq, 8)
        torch.testing.assert_close(graphed(x), model(x))
    assert len(graphed.graphs) == 2 and graphed.eager_calls == 2


def test_a_model_that_cannot_be_captured_runs_eagerly_and_says_why():
    def refuses(fn, inputs):
        raise RuntimeError("operation not permitted when stream is capturing\nmore")

    model = nn.Linear(4, 2).eval()
    graphed = GraphedCallable(model, capture=refuses)
    x = torch.randn(3, 4)
    torch.testing.assert_close(graphed(x), model(x))
    torch.testing.assert_close(graphed(x), model(x))
    assert graphed.eager_calls == 2
    assert graphed.describe() == "CUDA graphs not used: capture failed (RuntimeError: operation not permitted when stream is capturing)"


def test_runners_use_graphs_only_on_cuda():
    model = nn.Linear(4, 2).eval()
    assert TorchRunner(model, ["x"], device="cpu", cuda_graphs=True).graphs is None
    assert TorchRunner(model, ["x"], device="cuda", cuda_graphs=False).graphs is None


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_real_cuda_graphs():
    model = TwoHeads().cuda().eval()
    graphed = GraphedCallable(model, capture=cuda_capture)
    with torch.inference_mode():
        for batch in (3, 1, 6, 3):
            x, mask = torch.randn(batch, 6, device="cuda"), torch.rand(batch, 16, device="cuda")
            got_a, got = graphed(x, mask)
            want_a, want = model(x, mask)
            torch.testing.assert_close(got_a, want_a)
            torch.testing.assert_close(got["b"], want["b"])
    assert graphed.failed is None and len(graphed.graphs) == 3
    runner = TorchRunner(model, ["x", "mask"], device="cuda", cuda_graphs=True)
    feed = {"x": torch.randn(2, 6).numpy(), "mask": torch.ones(2, 16).numpy()}
    assert runner.run(feed)[0].shape == (2, 3) and runner.graphs.graphs
