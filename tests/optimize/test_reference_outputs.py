"""The eager reference on the validation batches: the first random batch is the forward check's own inputs, so its
outputs are taken from that run rather than computed twice (at BERT-large's opt shape one eager run takes 4 s)."""

from __future__ import annotations

import numpy as np

from infopt.api.build_inputs import same_feed, validation_batches
from infopt.api.logits_flow import reference_outputs
from infopt.core.inputspec import InputSpec
from infopt.core.sample_inputs import capture_feed, id_high

SPEC = InputSpec.parse(["input_ids:int64[batch,seq]", "attention_mask:int64[batch,seq]"], ["batch=1:8:32", "seq=1:16:64"])


class Counting:
    def __init__(self):
        self.fed = []

    def run(self, feed):
        self.fed.append(feed)
        return [feed["input_ids"].sum(axis=1, keepdims=True).astype(np.float32)]


def test_the_forward_checks_run_is_the_reference_on_the_first_random_batch_and_only_there():
    feed = capture_feed(SPEC, int_high=id_high(None))  # the builder gives both the module's bound
    batches, source = validation_batches(SPEC, None, 64, None, random_batches=3)
    assert source == "random" and same_feed(batches[0], feed) and not same_feed(batches[1], feed)
    eager = Counting()
    forward = (feed, eager.run(feed))
    eager.fed.clear()
    outputs, taken = reference_outputs(eager, batches, forward)
    assert taken == 1 and [f is b for f, b in zip(eager.fed, batches[1:])] == [True, True] and len(eager.fed) == 2
    for got, batch in zip(outputs, batches):
        np.testing.assert_array_equal(got[0], Counting().run(batch)[0])
    # other inputs (a --val file's, or a batch the capture's sizes do not give) are all run
    other = [{k: v + 1 for k, v in b.items()} for b in batches]
    eager.fed.clear()
    assert reference_outputs(eager, other, forward)[1] == 0 and len(eager.fed) == 3
    assert reference_outputs(eager, batches, None)[1] == 0


def test_an_opt_of_one_is_captured_at_two_and_so_run_again():
    spec = InputSpec.parse(["x:float32[batch,4]"], ["batch=1:1:8"])
    batches, _ = validation_batches(spec, None, 64, None, random_batches=1)
    assert not same_feed(batches[0], capture_feed(spec))
