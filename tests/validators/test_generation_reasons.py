"""A failed text-generation verdict says whether the text it was judged on could tell, and how much more would."""

from __future__ import annotations

from infopt.validators.generation_eval import _reason


def _check(measured: float, interval: tuple[float, float], name: str = "ppl_delta", limit: float = 0.10) -> dict:
    return {"name": name, "measured": measured, "limit": limit, "passed": False, "interval": list(interval)}


def test_a_miss_whose_interval_holds_the_limit_says_the_text_cannot_tell_and_how_much_more_would():
    # the real SmolLM2's INT4 build on 40 sentences: +10.5 % (+6.9 % to +14.2 %) over 691 tokens
    said = _reason(_check(0.1048, (0.0686, 0.1422)), 691)
    assert "ppl_delta 0.1048 > 0.1" in said and "holds the limit: 691 tokens of --val text cannot tell" in said
    # half-width 3.68 points: (3.68 / 2)^2 = 3.4x the tokens for +/- 2 points
    assert "about 2,340 teacher-forced tokens of --val text (3.4x as much)" in said
    assert said.endswith("a model with random weights agrees little, its logits being nearly flat")


def test_a_clear_miss_says_nothing_of_the_interval():
    said = _reason(_check(0.24, (0.19, 0.30)), 2048)
    assert "interval" not in said and said.startswith("ppl_delta 0.24 > 0.1 (relative perplexity increase")


def test_an_interval_already_within_two_points_asks_for_no_more_text():
    said = _reason(_check(0.79, (0.785, 0.805), name="top1", limit=0.80), 20000)
    assert "top1 0.79 < 0.8" in said and "cannot tell" in said and "teacher-forced tokens of --val" not in said


def test_a_check_without_an_interval_reads_as_before():
    check = _check(0.2, (0, 0))
    check["interval"] = None
    assert "interval" not in _reason(check, 100)


def test_a_folder_that_stopped_early_differs_where_its_tokens_end():
    from infopt.validators.generation import compare_tokens

    # a folder whose logits are not finite stops at once (its argmax is the end token): no tokens at all
    found = compare_tokens([[], [4, 5], [4, 5, 6, 7], [4, 9, 6]], [[4, 5, 6]] * 4)
    assert found["equal"] == 0 and [d["at_token"] for d in found["differences"]] == [0, 2, 3]
    assert compare_tokens([[4, 5, 6]], [[4, 5, 6]])["equal"] == 1
