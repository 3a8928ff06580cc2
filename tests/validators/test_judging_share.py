"""A model past 100M parameters is judged on a share of the samples, never below a floor, and its
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
)
from infopt.validators.generation import agreement_of, wilson_interval


def test_a_small_model_is_judged_on_every_sample_and_a_large_one_on_the_floors():
    """Past JUDGED_PARAMETERS, a share of the greedy tokens (at least MIN_NEW_TOKENS) and the first held-out sequences
    holding MIN_FORCED_TOKENS: a teacher-forced token costs what a token of the build's own work does, so a fixed
    count keeps the judging's part of the build about the same at every size (at 1.5B, 768 tokens with 40 --val
    lines made it 38 % of an INT4 build, 2026-11-29)."""
    sequences = [[i] * 128 for i in range(32)]  # 32 --val lines of 128 tokens
    assert judged_tokens(int(JUDGED_PARAMETERS)) == NEW_TOKENS and judged_sequences(sequences, 10**6) == sequences
    assert judged_sequences(sequences, int(JUDGED_PARAMETERS)) == sequences
    assert judged_tokens(int(1.5e9)) == MIN_NEW_TOKENS and judged_tokens(int(8e9)) == MIN_NEW_TOKENS
    for size in (0.5e9, 1.5e9, 70e9):  # the first two lines: MIN_FORCED_TOKENS, 256
        assert judged_sequences(sequences, int(size)) == sequences[:MIN_FORCED_TOKENS // 128]
    assert judged_tokens(int(JUDGED_PARAMETERS * 2)) == NEW_TOKENS // 2
    few = [[1] * 10] * 3
    assert judged_sequences(few, int(70e9)) == few  # fewer than the floor: all of them
    random_ids = [[1] * 64] * 8  # no --val: 8 sequences of random ids
    assert len(judged_sequences(random_ids, int(1.5e9))) == 4  # the floor: 256 tokens
    # the greedy check's four prompts of 32 tokens, their prefill's figures counted: one line of 128 makes the floor
    assert judged_sequences(sequences, int(1.5e9), counted=128) == sequences[:1]
    assert judged_sequences(sequences, int(1.5e9), counted=MIN_FORCED_TOKENS) == []
    assert judged_sequences(sequences, int(JUDGED_PARAMETERS), counted=128) == sequences  # a small model: every one


@pytest.mark.parametrize("share,count", [(1.0, 256), (1.0, 128), (0.0, 50), (0.5, 100), (0.1465, 512)])
def test_the_interval_holds_the_share_inside_zero_to_one_and_narrows_with_more_tokens(share, count):
    low, high = wilson_interval(share, count)
    assert 0.0 <= low <= share <= high <= 1.0 and high - low > 0
    wider = wilson_interval(share, count // 4)
    assert wider[1] - wider[0] > high - low


def test_the_agreement_reports_its_interval():
    import numpy as np

    found = agreement_of([np.array([1, 2, 3, 4])], [np.zeros(3)], [np.array([1, 2, 3, 5])], [np.zeros(3)])
    assert found["top1"] == 0.75 and found["top1_interval"] == list(wilson_interval(0.75, 4))
