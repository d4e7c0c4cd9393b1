"""Lab 00's checks: the solution passes, every typical wrong answer is caught
with a message naming its mistake, and right answers written differently pass.

All answers are graded together with ``harness.grade_batch`` and the same
exercise declarations that the notebook's ``check_*`` calls use: the four
formulas in this process, every ``hello`` in one launch per world size (2
visible, 3 hidden).  tests/nbgrader/test_labs_autograde.py runs the real notebook.
"""
import re
from pathlib import Path

import nbformat
import pytest

from parlab.grading import harness, lab00
from parlab.grading.numbers import number_message, plain_number
from wrong_answers import lab00 as answers

pytestmark = [pytest.mark.ranks, pytest.mark.timeout(300)]

SOLUTION = Path(__file__).resolve().parents[2] / "solutions" / "00-setup" / "00-setup.ipynb"
BY_NAME = {ex.answer: ex for ex in lab00.EXERCISES}
WRONG = {**answers.WRONG, "hello": answers.HELLO + answers.RULES}


def solution_functions() -> dict:
    """Run the answer cells of the solution notebook (they only define functions)."""
    ns: dict = {}
    for cell in nbformat.read(SOLUTION, as_version=4).cells:
        if cell.metadata.get("nbgrader", {}).get("solution") and cell.cell_type == "code":
            exec(compile(cell.source, f"<{cell.metadata.nbgrader.grade_id}>", "exec"), ns)
    return ns


@pytest.fixture(scope="module")
def graded():
    """{(exercise, answer name): (visible message, hidden message)} for every answer here."""
    ns = solution_functions()
    batch = {ex: {"solution": ns[name]} for name, ex in BY_NAME.items()}
    for name, fixtures in WRONG.items():
        batch[BY_NAME[name]].update({fn.__name__: fn for fn, _ in fixtures})
    for name, fixtures in answers.RIGHT.items():
        batch[BY_NAME[name]].update({fn.__name__: fn for fn in fixtures})
    visible = harness.grade_batch(batch)
    hidden = harness.grade_batch(batch, hidden=True)
    return {(key.split(".", 1)[1], name): (visible[key, name], hidden[key, name])
            for key, name in visible}


def test_the_solution_passes_visible_and_hidden(graded):
    for name in BY_NAME:
        assert graded[name, "solution"] == (None, None), name


CAUGHT = [(name, fn.__name__, words) for name, fixtures in WRONG.items() for fn, words in fixtures]


@pytest.mark.parametrize("exercise,answer,words", CAUGHT, ids=[f"{e}-{a}" for e, a, _ in CAUGHT])
def test_wrong_answer_is_caught_with_a_message_naming_its_mistake(graded, exercise, answer, words):
    visible, hidden = graded[exercise, answer]
    message = visible or hidden
    assert message, f"{answer} passed both the visible and the hidden cases"
    assert re.search(words, message), f"message does not name the mistake: {message}"


RIGHT = [(name, fn.__name__) for name, fixtures in answers.RIGHT.items() for fn in fixtures]


@pytest.mark.parametrize("exercise,answer", RIGHT, ids=[f"{e}-{a}" for e, a in RIGHT])
def test_right_answer_written_differently_passes(graded, exercise, answer):
    assert graded[exercise, answer] == (None, None)


def test_rule_fixtures_are_right_but_for_the_rule(graded):
    """Each printing fixture returns the right strings: only the rule catches it."""
    for fn, _ in answers.RULES:
        message = graded["hello", fn.__name__][0]
        assert "gives the right values" in message and lab00.PRINTS.says in message, message


def test_hidden_cases_catch_what_the_visible_ones_miss(graded):
    for exercise, answer, words in [("gpus_to_hold_state", "gpus_round", "rounded down|nearest"),
                                    ("hello", "hello_fixed_world_of_two", r"dist\.get_world_size")]:
        visible, hidden = graded[exercise, answer]
        assert visible is None and re.search(words, hidden), (visible, hidden)


def test_visible_cases_hold_the_commonest_traps(graded):
    for answer in ("gpus_floor", "weight_always_bf16"):
        exercise = next(name for name, fixtures in WRONG.items()
                        if answer in [fn.__name__ for fn, _ in fixtures])
        assert graded[exercise, answer][0], answer


def test_public_checks_pass_and_fail_like_the_batch(capsys):
    ns = solution_functions()
    lab00.check_gpus_to_hold_state(ns["gpus_to_hold_state"], hidden=True)
    assert capsys.readouterr().out.strip() == "gpus_to_hold_state: 5 hidden cases passed"
    with pytest.raises(AssertionError, match="you rounded down"):
        lab00.check_gpus_to_hold_state(answers.gpus_floor)
    with pytest.raises(AssertionError, match="did the cell that defines it run"):
        lab00.check_days_to_train(None)


def test_check_hello_end_to_end():
    with pytest.raises(AssertionError, match="printed nothing"):
        lab00.check_hello(answers.hello_returns_without_printing, hidden=True)  # 3 ranks
    assert harness.summary(lab00.HELLO, "hello", False) == "hello: 1 visible case passed on 2 ranks"


def test_solution_numbers_match_the_lecture():
    ns = solution_functions()
    assert ns["weight_bytes"](70e9, 2) == 140e9
    assert ns["training_state_bytes"](70e9) == 1120e9
    assert ns["gpus_to_hold_state"](70e9, 80e9) == 14
    assert round(ns["days_to_train"](70e9, 15e12, 1024, 989e12, 0.4)) == 180


# ------------------------------------------------------------------ messages, without ranks
ODD = [None, "140", [1, 2], {"a": 1}, float("nan"), float("inf"), -1.0, True,
       plain_number(object()), plain_number(b"\x00" * 500)]


@pytest.mark.parametrize("got", ODD, ids=repr)
def test_number_messages_never_crash_on_odd_values(got):
    message = number_message(got, 140e9, "weight_bytes(70e9, 2)", [(1.12e12, "bits")], unit="bytes")
    assert message.startswith("weight_bytes(70e9, 2) returned ")


@pytest.mark.parametrize("got", ODD + ["hello from rank 0 of 2", 0])
def test_hello_messages_never_crash_on_odd_values(got):
    lab00._hello_message(0, got, [got, got], 2)
    lab00._hello_not_printed([{"printed": got if isinstance(got, str) else ""}, {}], lab00.HELLO.visible[0][1][0], 2)


def test_messages_never_show_two_equal_values_as_different():
    # 2 parts in a million off: six digits would print both as 1.4e+11.
    message = number_message(140e9 * (1 + 2e-6), 140e9, "weight_bytes(70e9, 2)", unit="bytes")
    got, want = re.search(r"returned (\S+) bytes, expected (\S+) bytes", message).groups()
    assert got != want
    ratio = re.search(r"Yours is (\S+) times", message).group(1)
    assert float(ratio) != 1.0
    assert "returned 1 GPU, expected 2 GPUs" in number_message(1, 2, "gpus_to_hold_state(7.5e9, 80e9)",
                                                               unit="GPUs", integer=True)
