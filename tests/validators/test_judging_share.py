"""A model past a quarter of a billion parameters is judged on a share of the samples, never below a floor, and its
top-1 agreement comes with a 95 % interval."""

from __future__ import annotations

import pytest

from infopt.api.generation import (
    JUDGED_PARAMETERS,
    MIN_FORCED_TOKENS,
    MIN_NEW_TOKENS,
    NEW_TOKENS,
    judged_sequences,
    judged_tokens,
    reported_sequences,
)
from infopt.validators.generation import agreement_of, wilson_interval


def test_a_small_model_is_judged_on_every_sample_and_a_large_one_on_a_share_above_the_floor():
    sequences = [[1] * 128] * 32  # 32 --val lines of 128 tokens
    assert judged_tokens(int(JUDGED_PARAMETERS)) == NEW_TOKENS and judged_sequences(sequences, 10**6) == sequences
    assert judged_tokens(int(1.5e9)) == MIN_NEW_TOKENS and judged_tokens(int(8e9)) == MIN_NEW_TOKENS
    at_1_5b = judged_sequences(sequences, int(1.5e9))  # a sixth of 4096 tokens: 683, in 6 lines of 128
    assert len(at_1_5b) == 6 and sum(map(len, at_1_5b)) >= 32 * 128 / 6
    at_0_5b = judged_sequences(sequences, int(0.5e9))  # half, and 8 greedy tokens a prompt of 16
    assert len(at_0_5b) == 16 and judged_tokens(int(0.5e9)) == NEW_TOKENS // 2
    assert sum(map(len, judged_sequences(sequences, int(70e9)))) == MIN_FORCED_TOKENS  # the floor
    few = [[1] * 10] * 3
    assert judged_sequences(few, int(70e9)) == few  # fewer than the floor: all of them
    random_ids = [[1] * 64] * 8  # no --val: 8 sequences of random ids
    assert len(judged_sequences(random_ids, int(1.5e9))) == 4  # the floor: 256 tokens
    # no teacher-forced budget (a float32 build): the share alone, 86 of 512 tokens, and never no sequence
    assert len(judged_sequences(random_ids, int(1.5e9), floor=0)) == 2
    assert len(judged_sequences(random_ids, int(70e9), floor=0)) == 1


def test_figures_no_budget_judges_are_reported_on_one_sequence_past_the_judged_size():
    """A float32 build is judged by its greedy tokens; its teacher-forced figures, each token a forward of the model in
    torch and in the folder, are measured on every sequence of a small model and on the first alone past
    JUDGED_PARAMETERS (at 1.5B with 32 --val lines, 768 tokens took 21 s of a 78 s build)."""
    sequences = [[i] * 128 for i in range(32)]
    assert reported_sequences(sequences, int(JUDGED_PARAMETERS)) == sequences
    assert reported_sequences(sequences, int(1.5e9)) == [[0] * 128] and reported_sequences(sequences[:0], int(8e9)) == []


@pytest.mark.parametrize("share,count", [(1.0, 256), (0.0, 50), (0.5, 100), (0.1465, 512)])
def test_the_interval_holds_the_share_inside_zero_to_one_and_narrows_with_more_tokens(share, count):
    low, high = wilson_interval(share, count)
    assert 0.0 <= low <= share <= high <= 1.0 and high - low > 0
    wider = wilson_interval(share, count // 4)
    assert wider[1] - wider[0] > high - low


def test_the_agreement_reports_its_interval():
    import numpy as np

    found = agreement_of([np.array([1, 2, 3, 4])], [np.zeros(3)], [np.array([1, 2, 3, 5])], [np.zeros(3)])
    assert found["top1"] == 0.75 and found["top1_interval"] == list(wilson_interval(0.75, 4))
