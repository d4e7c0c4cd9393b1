"""Hostile submissions, graded by ``parlab grade`` here, inside the operating-system boundary.

One ``parlab grade --workers 2`` run over the class of hostile_submissions.py
(five hostile lab 00 submissions and one correct submission graded after
them; the attacks are listed there).  Then:

- the submission holding links (h5) is refused, its reason naming the
  link, and nothing the links point at is in ``autograded/`` or
  ``feedback/``;
- every attacked exercise scores 0, every other exercise full marks, and
  the correct submission graded after them all full marks; the FIFOs a
  kernel puts in its hand-in folder cost their own exercises and stall
  nothing;
- what the attacks tried to read (the solution notebook, another student's
  submission) appears nowhere in their autograded notebooks or feedback;
- the cells that reached a bound say which bound;
- the course tree (outside the grading state nbgrader writes), the
  repository's lab 00 solution and the installed lab 00 checks are
  byte-for-byte unchanged; no connection reached this machine's own
  non-loopback address; and no process of the run is left, under the
  run's token or under a box's uid.

tests/slurm/test_grade_hostile_slurm.py checks the submissions whose
attacks meet the Slurm task's cgroups (h3, h4, then zz) through ``parlab
grade --slurm``, tests/nbgrader/test_hostile_non_root.py a part of the class
(h1, h4, h5, zz) as an unprivileged user; every attack is checked here.
"""
from __future__ import annotations

import pytest

import hostile_submissions as hostile
from hostile_submissions import (  # noqa: F401 - the shared tests, run on this module's graded
    test_a_fifo_hand_in_costs_its_exercise_and_no_wait, test_a_submission_holding_links_is_refused_unread,
    test_attacked_exercises_score_zero_the_rest_full_marks, test_cells_that_reach_a_bound_say_which,
    test_course_tree_and_code_unchanged, test_every_submission_graded, test_network_is_loopback_only,
    test_nothing_left_running, test_nothing_reached_leaks_into_outputs_or_feedback)

pytestmark = [pytest.mark.nbgrader, pytest.mark.timeout(1500)]

TOKEN = "hostile-submissions-test"


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    return hostile.grade(hostile.make_class(tmp_path_factory.mktemp("hostile"), TOKEN), TOKEN, "--workers", "2")
