"""Lab 08's checks, through tests/answer_suite.py: the correct answers of tests/wrong_answers/lab08.py
pass, its wrong ones fail with a message that names the mistake, every stated rule is broken by one.

Every answer of the three exercises is graded in one ``harness.grade_batch`` per test set: one
launch at 3 ranks for the visible cases, one at 2 for the hidden ones; the scaler that
all-reduces only on an overflowing rank is graded alone.
"""
import pytest

from answer_suite import AnswerSuite
from parlab.grading import lab08
from parlab.grading.lab08 import checkpoint, clipping
from wrong_answers import lab08 as answers

pytestmark = [pytest.mark.ranks, pytest.mark.timeout(600)]


class TestAnswers(AnswerSuite):
    exercises = lab08.EXERCISES
    answers = answers
    alone_timeout = 12.0


def test_not_a_class():
    with pytest.raises(AssertionError, match="expected your LossScaler"):
        lab08.check_loss_scaler(None)


def test_the_cases_split_unevenly():
    """Every graded case has a tensor whose rows do not divide, and one some rank holds none of."""
    for n, cases in checkpoint.VISIBLE + checkpoint.HIDDEN:
        for case in cases:
            rows = [s[0] for _, s in case.shapes]
            assert any(r % n for r in rows) and any(r < n for r in rows)
            assert any(r % m for r in rows for m in case.targets if m > 1)
    assert clipping.rows_of(5, 3, 4) == (5, 5) and clipping.rows_of(7, 1, 3) == (3, 6)


def test_hsdp_prices_are_fsdp_and_dp_at_the_ends():
    """cost.hsdp_*: replicate = 1 is FSDP over S, shard = 1 is DP; between, each axis its own ring."""
    from parlab import cost

    psi = 115_008  # the notebook's Llama
    assert cost.hsdp_comm_elems(psi, 1, 4) == {"shard": cost.zero3_comm_elems(psi, 4), "replicate": 0}
    assert cost.hsdp_comm_elems(psi, 4, 1) == {"shard": 0, "replicate": cost.dp_comm_elems(psi, 4)}
    assert cost.hsdp_comm_elems(psi, 2, 2) == {"shard": 1.5 * psi, "replicate": psi / 2}
    assert cost.hsdp_memory_per_gpu(psi, 2, 2, 4, 4, 8) == 8 * psi == cost.zero_memory_per_gpu(psi, 2, 3, 4, 4, 8)
