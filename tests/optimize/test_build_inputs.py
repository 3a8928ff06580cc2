"""What a build measures drift on without --val: random batches at the dims' opt, fewer where eager is slow."""

from __future__ import annotations

from infopt.api.build_inputs import RANDOM_BATCHES, RANDOM_EAGER_S, random_batch_count, validation_batches
from infopt.core.inputspec import InputSpec


def test_random_validation_data_shrinks_with_the_cost_of_an_eager_run_to_one_batch():
    assert random_batch_count(0.01) == RANDOM_BATCHES == 4  # a small model: four batches
    assert random_batch_count(RANDOM_EAGER_S / 2.5) == 2
    assert random_batch_count(3.1) == 1 and random_batch_count(60.0) == 1  # BERT-large's 3 s: one, never none
    assert random_batch_count(0.0) == RANDOM_BATCHES


def test_the_count_is_the_batches_drift_is_measured_on():
    spec = InputSpec.parse(["x:float32[batch,4]"], ["batch=1:8:16"])
    batches, source = validation_batches(spec, None, None, None, random_batches=random_batch_count(3.1))
    assert source == "random" and len(batches) == 1 and batches[0]["x"].shape == (8, 4)
    batches, _ = validation_batches(spec, None, None, None)
    assert len(batches) == 4 and len({b["x"].tobytes() for b in batches}) == 4  # seeded apart
