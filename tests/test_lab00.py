"""Lab 00's checks: the solution passes, and every typical wrong answer is caught.

The cheap path: call ``parlab.grading.lab00.check_*`` directly on functions,
without nbgrader (tests/test_labs_autograde.py runs the real notebook).
"""
import re
from pathlib import Path

import nbformat
import pytest

import parlab
from parlab.grading import lab00
from wrong_answers import lab00 as wrong

pytestmark = [pytest.mark.ranks, pytest.mark.timeout(180)]

SOLUTION = Path(__file__).resolve().parents[1] / "solutions" / "00-setup" / "00-setup.ipynb"
NUMERIC = ["weight_bytes", "training_state_bytes", "gpus_to_hold_state", "days_to_train"]


def solution_functions() -> dict:
    """Run the answer cells of the solution notebook (they only define functions)."""
    ns: dict = {}
    for cell in nbformat.read(SOLUTION, as_version=4).cells:
        if cell.metadata.get("nbgrader", {}).get("solution") and cell.cell_type == "code":
            exec(compile(cell.source, f"<{cell.metadata.nbgrader.grade_id}>", "exec"), ns)
    return ns


def run_check(name, fn):
    check = getattr(lab00, f"check_{name}")
    check(fn)
    check(fn, hidden=True)


@pytest.mark.parametrize("name", NUMERIC)
def test_solution_passes_visible_and_hidden(name):
    run_check(name, solution_functions()[name])


CASES = [(name, fn, words) for name, fixtures in wrong.WRONG.items() for fn, words in fixtures]


@pytest.mark.parametrize("name,fn,words", CASES, ids=[f"{n}-{f.__name__}" for n, f, _ in CASES])
def test_wrong_answer_is_caught_with_a_named_mistake(name, fn, words):
    with pytest.raises(AssertionError) as info:
        run_check(name, fn)
    assert re.search(words, str(info.value)), f"message does not name the mistake: {info.value}"


def test_hidden_cases_catch_what_the_visible_ones_miss():
    # Both pass the visible case (70B in bf16; 1120 GB / 80 GB = 14 exactly) ...
    lab00.check_weight_bytes(wrong.weight_always_bf16)
    lab00.check_gpus_to_hold_state(wrong.gpus_floor)
    # ... and fail the hidden ones.
    with pytest.raises(AssertionError, match="bytes_per_param"):
        lab00.check_weight_bytes(wrong.weight_always_bf16, hidden=True)
    with pytest.raises(AssertionError, match="rounded down"):
        lab00.check_gpus_to_hold_state(wrong.gpus_floor, hidden=True)


def test_solution_numbers_match_the_lecture():
    ns = solution_functions()
    assert ns["weight_bytes"](70e9, 2) == 140e9
    assert ns["training_state_bytes"](70e9) == 1120e9
    assert ns["gpus_to_hold_state"](70e9, 80e9) == 14
    assert round(ns["days_to_train"](70e9, 15e12, 1024, 989e12, 0.4)) == 180


# ------------------------------------------------------------------ hello, on real ranks


def all_hellos():
    """On each rank: what the solution and every wrong hello() return (one launch for all)."""
    ns = {}
    exec(compile(next(c.source for c in nbformat.read(SOLUTION, as_version=4).cells
                      if c.get("id") == "hello"), "<hello>", "exec"), ns)
    out = {"solution": ns["hello"]()}
    for fn, _ in wrong.HELLO:
        out[fn.__name__] = fn()
    return out


def test_hello_judge_on_real_ranks():
    per_rank = parlab.launch(all_hellos, nproc=2)
    lab00.judge_hello([r["solution"] for r in per_rank], 2)  # the solution passes
    for fn, words in wrong.HELLO:
        with pytest.raises(AssertionError) as info:
            lab00.judge_hello([r[fn.__name__] for r in per_rank], 2)
        assert re.search(words, str(info.value)), f"{fn.__name__}: {info.value}"


def test_check_hello_end_to_end_rejects_a_fixed_rank():
    with pytest.raises(AssertionError, match=r"dist\.get_rank\(\)"):
        lab00.check_hello(wrong.hello_fixed_rank, hidden=True)  # 3 ranks
