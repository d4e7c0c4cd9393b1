"""The prediction-exercise grader (parlab.grading.predictions), in one process."""
from __future__ import annotations

import pytest

from parlab import cost
from parlab.grading.harness import Graded, grade_batch
from parlab.grading.predictions import NO_COST, prediction, prediction_grader, run_prediction
from parlab.grading.spy import Spy

pytestmark = [pytest.mark.unit, pytest.mark.timeout(60)]


def _mistakes(n, b):
    return [(n * b * 8, "Bits instead of bytes.")]


EX = prediction("demo.bytes", "weight_bytes", call="weight_bytes(n={}, b={})",
                want=lambda n, b: n * b, mistakes=_mistakes, unit="bytes",
                visible=((10, 2), (3, 4)), hidden=((7, 1),))


def test_declares_a_solo_exercise_with_the_no_cost_rule():
    assert EX.solo and EX.rules == (NO_COST,) and EX.run is run_prediction
    assert EX.visible == ((1, ((10, 2), (3, 4))),) and EX.hidden == ((1, ((7, 1),)),)


def test_grader_names_the_first_wrong_case_and_its_mistake():
    grade = prediction_grader("f(n={}, b={})", lambda n, b: n * b, _mistakes, unit="bytes")
    assert grade(Graded("f", 1, [(10, 2), (3, 4)], [[20, 12]])) is None
    msg = grade(Graded("f", 1, [(10, 2), (3, 4)], [[160, 96]]))  # bits on every case: the mistake is named
    assert msg.startswith("f(n=10, b=2) returned 160 bytes, expected 20 bytes.") and "Bits" in msg
    msg = grade(Graded("f", 1, [(10, 2), (3, 4)], [[20, 96]]))  # right on one case: bits do not explain it
    assert msg.startswith("f(n=3, b=4) returned 96 bytes, expected 12 bytes.") and "Bits" not in msg
    assert "did you forget the `return`" in grade(Graded("f", 1, [(10, 2)], [[None]]))
    # only the cases that ran are graded
    assert grade(Graded("f", 1, [(10, 2), (3, 4)], [[20]])) is None


def test_run_notes_calls_into_the_reference():
    spy = Spy()
    got = run_prediction(lambda n, b: cost.weights_bytes(n, b), (10, 2), 0, spy)
    rec = spy.record()
    assert got == 20 and NO_COST.broken([rec], (10, 2), 1).startswith("it called parlab.cost.weights_bytes")
    spy = Spy()
    run_prediction(lambda n, b: n * b, (10, 2), 0, spy)
    assert NO_COST.broken([spy.record()], (10, 2), 1) is None


def test_graded_end_to_end_in_process():
    report = grade_batch({EX: {"right": lambda n, b: n * b, "bits": lambda n, b: 8 * n * b,
                               "cheat": lambda n, b: cost.weights_bytes(n, b)}})
    assert report[("demo.bytes", "right")] is None
    assert "Bits instead of bytes." in report[("demo.bytes", "bits")]
    assert "The exercise says:" in report[("demo.bytes", "cheat")]


def test_a_case_that_is_not_a_tuple_is_the_one_argument():
    grade = prediction_grader(lambda case: f"f for {case['n']}", lambda case: 2 * case["n"])
    assert grade(Graded("f", 1, [{"n": 3}], [[6]])) is None
    assert grade(Graded("f", 1, [{"n": 3}], [[7]])).startswith("f for 3 returned 7, expected 6.")
