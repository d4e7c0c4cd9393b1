"""What the grader does with reports a submission wrote itself.

An answer runs in the same process as the harness that reports its results
(``harness.run_task``), so whatever comes back from a grading rank may have
been written by the answer: a report for every task with no cases in it,
one case of many, a report of another shape.  ``harness.judge`` reads those
as claims: every case sent must come back, on every rank, or the answer
fails, whatever the values that did come back.  These run the real lab 01
graders on forged reports, with no ranks.
"""
from __future__ import annotations

import pytest
import torch

from parlab.grading import harness
from parlab.grading.lab01 import collectives, ring

pytestmark = [pytest.mark.unit, pytest.mark.timeout(60)]

N, CASES = ring.RING.hidden[0]


def _right(i: int) -> dict:
    """Case i's result as an honest rank reports it (the values the grader expects)."""
    got = collectives.expected(CASES[i], N, i)
    return {"out": {"got": got, "right": True}, "spy": {"calls": [], "printed": "", "backward": 0,
                                                        "ddp": 0, "mutated": [], "events": []}}


def _judge(per_rank):
    return harness.judge(ring.RING, "ring_all_reduce", N, CASES, per_rank, "gloo")


def test_a_report_with_no_cases_fails_naming_the_first_case():
    message = _judge([{"cases": []} for _ in range(N)])
    assert message is not None and "gave no result for" in message
    assert CASES[0].describe(N) in message and "0 of" in message


def test_right_values_for_only_some_cases_fail_on_the_first_missing_one():
    per_rank = [{"cases": [_right(0)]} for _ in range(N)]
    message = _judge(per_rank)
    assert message is not None and CASES[1].describe(N) in message and f"1 of {len(CASES)}" in message


def test_one_rank_short_fails_naming_that_rank():
    per_rank = [{"cases": [_right(i) for i in range(len(CASES))]} for _ in range(N)]
    per_rank[N - 1]["cases"].pop()
    message = _judge(per_rank)
    assert message is not None and f"on rank {N - 1}" in message


def test_more_results_than_cases_fail():
    per_rank = [{"cases": [_right(i) for i in range(len(CASES))] * 2} for _ in range(N)]
    assert "was not graded" in _judge(per_rank)


@pytest.mark.parametrize("forged", [None, 7, {}, {"cases": "all"}, {"cases": [{"out": 1}]},
                                    {"error": 3}])
def test_reports_of_another_shape_fail(forged):
    per_rank = [{"cases": [_right(i) for i in range(len(CASES))]} for _ in range(N)]
    per_rank[0] = forged
    message = _judge(per_rank)
    assert message is not None and "was not graded" in message


def test_a_missing_rank_fails():
    assert "ranks reported" in _judge([{"cases": []}])


def test_the_backend_a_rank_claims_is_believed_only_when_it_could_have_run_on_it():
    gpu = torch.cuda.is_available()
    assert harness.reported_backend([{harness.BACKEND_KEY: "nccl"}]) == ("nccl" if gpu else "gloo")
    assert harness.reported_backend([{harness.BACKEND_KEY: "anything"}]) == "gloo"
    assert harness.reported_backend([None]) == "gloo"


def test_a_complete_report_is_judged_on_its_values_and_its_claims():
    """The control: every case present with the right values passes, even with a spy record
    claiming no call at all. The spy's record is the rank's own claim (feedback for honest
    mistakes, not enforcement: see docs/instructor.md); what the judge enforces is that every
    case comes back and every value is right."""
    per_rank = [{"cases": [_right(i) for i in range(len(CASES))]} for _ in range(N)]
    assert _judge(per_rank) is None
    per_rank[0]["cases"][0]["out"]["got"] = per_rank[0]["cases"][0]["out"]["got"] + 1
    assert "is wrong for" in _judge(per_rank)
