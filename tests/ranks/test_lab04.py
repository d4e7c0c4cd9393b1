"""Lab 04's checks, through tests/answer_suite.py: the correct answers of tests/wrong_answers/lab04.py
pass, its wrong ones fail with a message that names the mistake, every stated rule is broken by one,
including answers whose numbers are right but whose schedule is not (an "1F1B" that runs every
forward first, a loss sent back).

Launches are the cost (a 4-rank start takes 10-20 s on 2 cores): the suite grades every schedule
answer in one launch per world size; the answer that deadlocks and the one that raises on some
stages run alone, through the public check, within 40 s.
"""
import pytest

from answer_suite import AnswerSuite
from parlab.grading import lab04
from wrong_answers import lab04 as answers

pytestmark = [pytest.mark.ranks, pytest.mark.timeout(600)]


class TestAnswers(AnswerSuite):
    exercises = lab04.EXERCISES
    answers = answers
    alone_timeout = 40

    @pytest.mark.parametrize("key,answer", [("1f1b", "ofob_all_forward_first")])
    def test_schedule_rule_quotes_the_notebook(self, visible, key, answer):
        msg = visible[(key, answer)]
        assert "right values" in msg and 'The exercise says: "Stage r runs min(p − r − 1, m)' in msg, msg
        assert "stage 0 ran 8 forwards before its first backward" in msg, msg
