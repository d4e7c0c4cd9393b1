"""Lab 05's checks, through tests/answer_suite.py: the correct answers of tests/wrong_answers/lab05.py
pass, its wrong ones fail with a message that names the mistake, every stated rule is broken by one.

Every answer of every exercise is graded in one ``harness.grade_batch`` per test set: one launch
at 3 ranks for the visible cases, and for the hidden ones one at 4 ranks (ZeRO) and one at 2
(FSDP2) (a launch costs 10-60 s on this 2-core machine).
"""
import pytest

from answer_suite import AnswerSuite
from parlab.grading import lab05
from parlab.grading.lab05 import hints
from wrong_answers import lab05 as answers

pytestmark = [pytest.mark.ranks, pytest.mark.timeout(600)]


class TestAnswers(AnswerSuite):
    exercises = lab05.EXERCISES
    answers = answers


def test_not_a_class():
    with pytest.raises(AssertionError, match="expected your ZeRO1"):
        lab05.check_zero1(None)


def test_uneven_shard_hint_fires_on_gloo_wording():
    """gloo's own size check (an unpadded all-gather) gets the padding hint, as torch's does."""
    gloo = "RuntimeError: Check failed: outputShape[0] * worldSize == inputShape[0] (84 vs. 83)"
    for text in (gloo, "ValueError: output tensor size must be equal to world_size times input"):
        assert "pad the flat vector" in hints.frozen_hint(text)
        assert "pad the flat vector" in hints.error_hint(text)
    assert hints.error_hint("RuntimeError: something else") == ""
