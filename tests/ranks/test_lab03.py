"""Lab 03's checks, through tests/answer_suite.py: the correct answers of tests/wrong_answers/lab03.py
pass the visible and the hidden cases, its wrong ones fail with a message that names the mistake,
and every stated rule is broken by one of them.

Everything goes through ``harness.grade_batch``: one launch per world size for all answers at
once (visible: 4 ranks; hidden: 2 and 3), graded by the same exercises as the notebook's checks.
"""
import pytest

from answer_suite import AnswerSuite
from parlab.grading import lab03
from wrong_answers import lab03 as answers

pytestmark = [pytest.mark.ranks, pytest.mark.timeout(400)]


class TestAnswers(AnswerSuite):
    exercises = lab03.EXERCISES
    answers = answers

    def breaks(self, rule, message):
        """A broken rule is quoted as the exercise states it; an uneven split is judged before the
        values, in words of its own that say the message must name both numbers."""
        return (f'The exercise says: "{rule.says}"' in message
                or "divisible" in rule.says and "names both numbers" in message)


def test_uneven_split_is_a_case_in_every_visible_set():
    for key in ("column", "row", "attn"):
        ex = lab03.EXERCISES[key]
        assert any(not c.divisible(n) for n, cases in ex.visible for c in cases), key
