"""A model past 100M parameters is judged on a share of the samples, never below a floor, and its
top-1 agreement and perplexity change come with 95 % intervals."""

from __future__ import annotations

import pytest

from infopt.api.generation_share import (
    JUDGED_PARAMETERS,
    MIN_FORCED_TOKENS,
    MIN_NEW_TOKENS,
    NEW_TOKENS,
    forced_tokens,
    interval_note,
    judged_sequences,
    judged_tokens,
)
from infopt.validators.generation import agreement_of, ppl_delta_interval, wilson_interval


def test_a_small_model_is_judged_on_every_sample_and_a_large_one_on_the_tokens_its_size_affords():
    """Past JUDGED_PARAMETERS, a share of the greedy tokens (at least MIN_NEW_TOKENS); at every size the first
    held-out sequences holding FORCED_PARAMETER_TOKENS over the parameters, at least MIN_FORCED_TOKENS: a
    teacher-forced token costs what a token of the build's own work does, so the judging keeps about the same part
    of the build at every size."""
    sequences = [[i] * 128 for i in range(32)]  # 32 --val lines of 128 tokens
    assert judged_tokens(int(JUDGED_PARAMETERS)) == NEW_TOKENS and judged_sequences(sequences, 10**6) == sequences
    assert judged_tokens(int(1.5e9)) == MIN_NEW_TOKENS and judged_tokens(int(8e9)) == MIN_NEW_TOKENS
    assert forced_tokens(int(135e6)) > 2000 and forced_tokens(int(0.5e9)) == 600
    assert forced_tokens(int(1.5e9)) == forced_tokens(int(70e9)) == MIN_FORCED_TOKENS
    for size in (135e6, 0.5e9, 1.5e9, 70e9):  # the first lines holding the size's tokens
        wanted = forced_tokens(int(size))
        assert judged_sequences(sequences, int(size)) == sequences[:-(-wanted // 128)]
    assert judged_tokens(int(JUDGED_PARAMETERS * 2)) == NEW_TOKENS // 2
    few = [[1] * 10] * 3
    assert judged_sequences(few, int(70e9)) == few  # fewer than the floor: all of them
    random_ids = [[1] * 64] * 8  # no --val: 8 sequences of random ids
    assert len(judged_sequences(random_ids, int(1.5e9))) == 4  # the floor: 256 tokens
    # the greedy check's four prompts of 32 tokens, their prefill's figures counted: one line of 128 makes the floor
    assert judged_sequences(sequences, int(1.5e9), counted=128) == sequences[:1]
    assert judged_sequences(sequences, int(1.5e9), counted=MIN_FORCED_TOKENS) == []


def test_the_perplexity_change_interval_holds_the_change_and_narrows_with_more_tokens():
    """Paired per-token changes, summed over runs of RUN_TOKENS: the interval holds the measured change, is
    about half as wide on four times the tokens, and is wider where the tokens' changes spread more."""
    import numpy as np

    rng = np.random.default_rng(0)
    reference = [rng.uniform(1, 4, 128) for _ in range(32)]
    noisy = [r + rng.normal(0.08, 0.4, r.size) for r in reference]
    found = agreement_of([np.zeros(129)] * 32, reference, [np.zeros(129)] * 32, noisy)
    low, high = found["ppl_delta_interval"]
    assert low < found["ppl_delta"] < high and 0.04 < found["ppl_delta"] < 0.13
    quarter = ppl_delta_interval(reference[:8], noisy[:8])
    assert 1.6 < (quarter[1] - quarter[0]) / (high - low) < 2.5
    calmer = ppl_delta_interval(reference, [r + 0.08 + (n - r - 0.08) / 4 for r, n in zip(reference, noisy)])
    assert calmer[1] - calmer[0] < (high - low) / 3
    assert ppl_delta_interval([np.zeros(5)], [np.ones(5)]) == (-1.0, float("inf"))  # one run: nothing known


def test_a_wide_interval_says_how_many_tokens_would_narrow_it():
    assert interval_note({"tokens": 500, "ppl_delta_interval": [0.01, 0.05]}) is None  # +/- 2 points
    note = interval_note({"tokens": 500, "ppl_delta_interval": [0.0, 0.08]})  # +/- 4: four times the tokens
    assert "+/- 4.0 points" in note and "about 2000 held-out tokens" in note


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
