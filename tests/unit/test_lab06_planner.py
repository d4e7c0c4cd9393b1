"""Lab 06's planner exercises: the right answers written differently pass, the typical wrong ones
are caught with a message that names the mistake.  Both exercises are plain functions graded in
this process (no ranks), visible and hidden cases in two grade_batch calls."""
import pytest

from grading_reports import short_keys
from parlab.grading import harness
from parlab.grading.lab06 import planner as lab06_planner
from wrong_answers import lab06_planner as answers

pytestmark = [pytest.mark.unit, pytest.mark.timeout(300)]  # grading every fixture under the profiler hook

EXERCISES = {"memory": lab06_planner.MEMORY, "choose": lab06_planner.CHOOSE}


def _batch(with_wrong: bool) -> dict:
    batch = {EXERCISES[ex]: dict(found) for ex, found in answers.CORRECT.items()}
    if with_wrong:
        for ex, fixtures in answers.WRONG.items():
            batch[EXERCISES[ex]].update({f.__name__: f for f, _ in fixtures})
    return batch


@pytest.fixture(scope="module")
def visible():
    return short_keys(harness.grade_batch(_batch(True)))


@pytest.fixture(scope="module")
def hidden():
    return short_keys(harness.grade_batch(_batch(True), hidden=True))


@pytest.mark.parametrize("ex,name", [(ex, n) for ex in answers.CORRECT for n in answers.CORRECT[ex]])
def test_correct_answers_pass_visible_and_hidden(visible, hidden, ex, name):
    assert visible[(ex, name)] is None, visible[(ex, name)]
    assert hidden[(ex, name)] is None, hidden[(ex, name)]


@pytest.mark.parametrize("ex,fixture,words",
                         [(ex, f, w) for ex, fs in answers.WRONG.items() for f, w in fs])
def test_wrong_answers_fail_visible_with_the_mistake_named(visible, ex, fixture, words):
    msg = visible[(ex, fixture.__name__)]
    assert msg is not None, f"{fixture.__name__} passed the visible {ex} check"
    assert words in msg, msg


@pytest.mark.parametrize("ex,fixture", [(ex, f) for ex, fs in answers.WRONG.items() for f, _ in fs])
def test_wrong_answers_fail_hidden_too(hidden, ex, fixture):
    assert hidden[(ex, fixture.__name__)] is not None, f"{fixture.__name__} passed the hidden {ex} check"


def test_every_rule_is_broken_by_a_fixture(visible):
    for name, exercise in EXERCISES.items():
        for rule in exercise.rules:
            assert any(msg and rule.says in msg for (ex, _), msg in visible.items() if ex == name), rule.says


def test_the_check_refuses_what_is_not_a_function():
    with pytest.raises(AssertionError, match="expected your choose"):
        lab06_planner.check_choose(None)


def test_a_plan_of_the_wrong_type_is_named():
    report = harness.grade_batch({lab06_planner.CHOOSE: {"as_dict": lambda work: {"dp": 8}}})
    assert "return a planner.Plan" in report[("lab06.choose", "as_dict")]
