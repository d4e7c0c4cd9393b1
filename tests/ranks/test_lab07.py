"""Lab 07's checks, through tests/answer_suite.py: the correct answers of tests/wrong_answers/lab07.py
pass, its wrong ones fail with a message that names the mistake, every stated rule is broken by one.

The ring is also graded on 4 ranks here (``ring.FOUR_RANKS``), which the notebook's budget leaves out.
"""
import dataclasses

import pytest

from answer_suite import AnswerSuite
from parlab.grading import lab07
from parlab.grading.lab07 import ring
from wrong_answers import lab07 as answers

pytestmark = [pytest.mark.ranks, pytest.mark.timeout(600)]

RING4 = dataclasses.replace(lab07.RING, key="lab07.ring4", visible=ring.FOUR_RANKS)


class TestAnswers(AnswerSuite):
    exercises = lab07.EXERCISES
    answers = answers
    alone_timeout = 16

    def extra_visible(self):
        """The ring on 4 ranks too, when the selected tests read all of the ring's answers."""
        if not self.wants("ring"):
            return {}
        return {RING4: {a.__name__: a for a in answers.CORRECT["ring"]}}

    @pytest.mark.parametrize("key", ["ring"], ids=["ring-four_ranks"])  # -k "[ring-" selects it
    def test_the_ring_passes_on_four_ranks(self, visible, key):
        for a in answers.CORRECT["ring"]:
            assert visible[("ring4", a.__name__)] is None, visible[("ring4", a.__name__)]


def test_uneven_length_gets_a_clear_error():
    with pytest.raises(ValueError, match="not divisible by 6"):
        ring.layout_positions(10, 3, "zigzag")
