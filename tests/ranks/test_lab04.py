"""Lab 04's checks: they pass correct answers written several ways and reject
the wrong answers in tests/wrong_answers/lab04.py with a message that names
the mistake, including answers whose numbers are right but whose schedule is
not (an "1F1B" that runs every forward first, a loss sent back).

Launches are the cost (a 4-rank start takes 10-20 s on 2 cores), so every
schedule answer is graded in one launch per world size through
``harness.grade_batch``; only the answers that hang or raise on some ranks
run alone, through the public check, with a short timeout.
"""
import pytest

from parlab.grading import harness, lab04
from grading_reports import short_keys as _by_short_key
from wrong_answers import lab04 as answers

pytestmark = [pytest.mark.ranks, pytest.mark.timeout(600)]

CORRECT, WRONG = answers.CORRECT, answers.WRONG


@pytest.fixture(scope="module")
def visible():
    batch = {lab04.EXERCISES[ex]: dict(CORRECT[ex]) for ex in CORRECT}
    for ex, fixtures in WRONG.items():
        batch[lab04.EXERCISES[ex]].update({f.__name__: f for f, _ in fixtures})
    return _by_short_key(harness.grade_batch(batch))


@pytest.fixture(scope="module")
def hidden():
    return _by_short_key(harness.grade_batch({lab04.EXERCISES[ex]: dict(a) for ex, a in CORRECT.items()},
                                             hidden=True))


@pytest.mark.parametrize("ex,name", [(ex, n) for ex in CORRECT for n in CORRECT[ex]])
def test_correct_answers_pass_visible_and_hidden(visible, hidden, ex, name):
    assert visible[(ex, name)] is None, visible[(ex, name)]
    assert hidden[(ex, name)] is None, hidden[(ex, name)]


@pytest.mark.parametrize("ex,fixture,words", [(ex, f, w) for ex, fs in WRONG.items() for f, w in fs],
                         ids=lambda v: getattr(v, "__name__", str(v))[:30])
def test_wrong_answers_fail_with_their_mistake(visible, ex, fixture, words):
    msg = visible[(ex, fixture.__name__)]
    assert msg is not None, f"{fixture.__name__} passed the visible {ex} check"
    assert words in msg, msg


def test_schedule_rule_quotes_the_notebook(visible):
    msg = visible[("1f1b", "ofob_all_forward_first")]
    assert "right values" in msg and 'The exercise says: "Stage r runs min(p − r − 1, m)' in msg, msg
    assert "stage 0 ran 8 forwards before its first backward" in msg, msg


def test_deadlock_ends_quickly_naming_stage_and_send():
    fn, words = answers.DEADLOCK
    with pytest.raises(AssertionError) as info:
        lab04.check_1f1b(fn, timeout=40)
    msg = str(info.value)
    assert "rank" in msg and words in msg and "stage" in msg, msg


def test_detached_activation_is_explained():
    fn, words = answers.DETACHED
    with pytest.raises(AssertionError) as info:
        lab04.check_pipeline_forward_backward(fn, timeout=60)
    assert words in str(info.value), str(info.value)
