"""Lab 00's checks, through tests/answer_suite.py: the notebook's solution and the correct
answers of tests/wrong_answers/lab00.py pass, its wrong ones fail with a message that names
the mistake, and the printing rule is broken by some of them.

The four formulas are graded in this process, every ``hello`` in one launch per world size
(2 visible, 3 hidden).  The wrong answers are graded on the hidden cases too: those alone
must catch every mistake.  tests/nbgrader/test_labs_autograde.py runs the real notebook.
"""
import functools
import re
from pathlib import Path

import nbformat
import pytest

from answer_suite import AnswerSuite
from parlab.grading import harness, lab00
from parlab.grading.lab00 import hello
from parlab.grading.numbers import number_message
from parlab.grading.plain import plain_number
from wrong_answers import lab00 as answers

pytestmark = [pytest.mark.ranks, pytest.mark.timeout(300)]

SOLUTION = Path(__file__).resolve().parents[2] / "solutions" / "00-setup" / "00-setup.ipynb"

#: The wrong hello answers whose return values are right: only the printing rule catches them.
PRINTING = [answers.hello_returns_without_printing, answers.hello_prints_own_prefix,
            answers.hello_prints_on_rank0_only, answers.hello_prints_something_else,
            answers.hello_prints_to_stderr]


@functools.cache
def solution_functions() -> dict:
    """Run the answer cells of the solution notebook (they only define functions)."""
    ns: dict = {}
    for cell in nbformat.read(SOLUTION, as_version=4).cells:
        if cell.metadata.get("nbgrader", {}).get("solution") and cell.cell_type == "code":
            exec(compile(cell.source, f"<{cell.metadata.nbgrader.grade_id}>", "exec"), ns)
    return ns


@functools.cache
def notebook_solution(key: str):
    """The solution notebook's answer to exercise ``key``, graded as the answer "solution"."""
    answer = solution_functions()[key]

    def solution(*args):
        return answer(*args)
    return solution


class TestAnswers(AnswerSuite):
    exercises = lab00.EXERCISES
    answers = answers
    hidden_tables = ("CORRECT", "WRONG", "WRONG_HIDDEN")

    def table(self, name):
        """The notebook's own solution heads CORRECT: it passes visible and hidden too."""
        found = super().table(name)
        if name != "CORRECT":
            return found
        return {key: [notebook_solution(key), *found.get(key, [])] for key in self.exercises}

    @pytest.mark.parametrize("key", ["hello"], ids=["hello-printing"])  # -k "[hello-" selects it
    def test_printing_answers_are_right_but_for_the_rule(self, visible, key):
        for answer in PRINTING:
            message = visible[(key, answer.__name__)]
            assert "gives the right values" in message and hello.PRINTS.says in message, message

    @pytest.mark.parametrize("key", list(answers.WRONG), ids=lambda key: f"{key}-hidden")
    def test_the_hidden_cases_alone_catch_every_wrong_answer(self, hidden, key):
        for answer, _ in answers.WRONG[key]:
            message = hidden[(key, answer.__name__)]
            assert message is not None, f"{answer.__name__} passed the hidden {key} check"


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
    assert harness.summary(hello.HELLO, "hello", False) == "hello: 1 visible case passed on 2 ranks"


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
    hello.message(0, got, [got, got], 2)
    hello.not_printed([{"printed": got if isinstance(got, str) else ""}, {}], hello.HELLO.visible[0][1][0], 2)


def test_messages_never_show_two_equal_values_as_different():
    # 2 parts in a million off: six digits would print both as 1.4e+11.
    message = number_message(140e9 * (1 + 2e-6), 140e9, "weight_bytes(70e9, 2)", unit="bytes")
    got, want = re.search(r"returned (\S+) bytes, expected (\S+) bytes", message).groups()
    assert got != want
    ratio = re.search(r"Yours is (\S+) times", message).group(1)
    assert float(ratio) != 1.0
    assert "returned 1 GPU, expected 2 GPUs" in number_message(1, 2, "gpus_to_hold_state(7.5e9, 80e9)",
                                                               unit="GPUs", integer=True)
