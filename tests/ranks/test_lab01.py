"""Lab 01's checks, through tests/answer_suite.py: the correct answers of
tests/wrong_answers/lab01.py pass, its wrong ones fail with a message that names the
mistake, every stated rule is broken by one of them.

Launches are the cost (a cold 4-rank start is ~10 s on 2 cores), so the answers are graded
together, one launch per world size (visible: 4 ranks; hidden: 3 and 2).  The answers that
hang or crash the launch (a deadlock, a size mismatch, an error on one rank) run alone,
through the public check, with a short timeout.
"""
import pytest

from answer_suite import AnswerSuite
from parlab.grading import lab01
from wrong_answers import lab01 as answers

pytestmark = [pytest.mark.ranks, pytest.mark.timeout(240)]


class TestAnswers(AnswerSuite):
    exercises = lab01.EXERCISES
    answers = answers
    alone_timeout = 16

    @pytest.mark.parametrize("key,answer", [("rs_ag", "rs_ag_forgets_remainder")])
    def test_messages_name_case_and_rank(self, visible, key, answer):
        msg = visible[(key, answer)]
        assert "numel 10" in msg and "world_size 4" in msg and "rank 0" in msg, msg

    @pytest.mark.parametrize("key,answer", [("ring", "ring_uses_all_reduce")])
    def test_rule_messages_quote_the_notebook(self, visible, key, answer):
        msg = visible[(key, answer)]
        assert "right values" in msg and 'The exercise says: "Use only `dist.send`' in msg, msg


def test_public_check_passes_and_reports(capsys):
    lab01.check_ring_allreduce(answers.ring_isend_irecv)
    assert "5 visible cases passed on 4 ranks" in capsys.readouterr().out


def test_not_a_function():
    with pytest.raises(AssertionError, match="expected your tree_broadcast"):
        lab01.check_tree_broadcast(None)


# ---------------------------------------------------------------- exercise 4 (in process)

def test_bandwidths_public_check(capsys):
    lab01.check_bandwidths(answers.bandwidths)
    lab01.check_bandwidths(answers.bandwidths, hidden=True)
    out = capsys.readouterr().out
    assert "3 visible cases passed" in out and "4 hidden cases passed" in out and "ranks" not in out


@pytest.mark.parametrize("fixture,words", [
    (answers.bw_factor_two, "factor 2"), (lambda *a: None, "forget the `return`"),
    (lambda *a: (1.0,), "should return a pair")])
def test_bandwidths_odd_returns(fixture, words):
    with pytest.raises(AssertionError, match=words):
        lab01.check_bandwidths(fixture)


# ---------------------------------------------------------------- exercise 3's hints (no launch)

def test_power_of_two_sentence_only_on_its_evidence():
    """The sentence about a world size that is not a power of two needs its evidence: every case at
    that world size failed, and the ranks left out are exactly those ⌊log2 n⌋ rounds of doubling
    leave out (distance 4 or more from the root on 5 ranks)."""
    from parlab.grading.lab01 import collectives as c

    case, n = c.Case((5,), root=1), 5
    xs = [c.make_input(case, r, salt=0) for r in range(n)]
    doubling_gap = [xs[1] if r != 0 else xs[0] for r in range(n)]  # rank 0 is at distance 4 from root 1
    assert "not a power of two" in c._diagnose(case, n, 0, doubling_gap, [])
    assert "power of two" not in c._diagnose(case, n, 0, doubling_gap, [c.Case((3,), root=0)])
    returned_input = [xs[r] for r in range(n)]  # every rank left out: no tree at all
    message = c._diagnose(case, n, 0, returned_input, [])
    assert "never reached" in message and "power of two" not in message, message
