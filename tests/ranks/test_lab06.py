"""Lab 06's checks (sections 1-3), through tests/answer_suite.py: the correct answers of
tests/wrong_answers/lab06.py pass, its wrong ones fail with a message that names the mistake.

The coordinate exercises are graded in this process.  The all-reduces and the DP sync go
through ``harness.grade_batch``: one launch per world size for all answers at once
(visible: 4 ranks; hidden: 2).  The answer that creates only its own group crashes or
waits on some ranks, so it runs alone, through the public check, with a short timeout.
"""
import pytest

from answer_suite import AnswerSuite
from parlab.grading import lab06
from parlab.grading.lab06 import planner
from wrong_answers import lab06 as answers

pytestmark = [pytest.mark.ranks, pytest.mark.timeout(300)]


class TestAnswers(AnswerSuite):
    exercises = {key: ex for key, ex in lab06.EXERCISES.items()  # the planner's: tests/unit/test_lab06_planner.py
                 if ex not in (planner.MEMORY, planner.CHOOSE)}
    answers = answers

    def breaks(self, rule, message):
        """The new_group rule is broken by a hang, whose hint says it in other words."""
        return rule.says in message or ("dist.new_group" in rule.says and "even for the groups it is not in" in message)


def test_not_a_function():
    with pytest.raises(AssertionError, match="expected your coords"):
        lab06.check_coords(None)
