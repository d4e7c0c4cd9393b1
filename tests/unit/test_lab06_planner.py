"""Lab 06's planner exercises, through tests/answer_suite.py: the right answers written differently
pass, the typical wrong ones are caught with a message that names the mistake.  Both exercises are
plain functions graded in this process (no ranks), visible and hidden cases in two grade_batch calls."""
import pytest

from answer_suite import AnswerSuite
from parlab.grading import harness
from parlab.grading.lab06 import planner as lab06_planner
from wrong_answers import lab06_planner as answers

pytestmark = [pytest.mark.unit, pytest.mark.timeout(300)]  # grading every fixture under the profiler hook


class TestAnswers(AnswerSuite):
    exercises = {"memory": lab06_planner.MEMORY, "choose": lab06_planner.CHOOSE}
    answers = answers
    hidden_tables = ("CORRECT", "WRONG")

    @pytest.mark.parametrize("ex,fixture", [(ex, f) for ex, fs in answers.WRONG.items() for f, _ in fs])
    def test_wrong_answers_fail_hidden_too(self, hidden, ex, fixture):
        assert hidden[(ex, fixture.__name__)] is not None, f"{fixture.__name__} passed the hidden {ex} check"


def test_the_check_refuses_what_is_not_a_function():
    with pytest.raises(AssertionError, match="expected your choose"):
        lab06_planner.check_choose(None)


def test_a_plan_of_the_wrong_type_is_named():
    report = harness.grade_batch({lab06_planner.CHOOSE: {"as_dict": lambda work: {"dp": 8}}})
    assert "return a planner.Plan" in report[("lab06.choose", "as_dict")]
