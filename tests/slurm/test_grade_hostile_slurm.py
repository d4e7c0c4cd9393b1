"""The hostile class graded by ``parlab grade --slurm``: one array job through the private cluster of conftest.py.

The same class as tests/nbgrader/test_hostile_submissions.py (hostile_submissions.py:
four hostile lab 00 submissions and a correct one) goes through one
``sbatch --array`` job, one task per submission, at most two at once
(``--throttle 2``, as the local run's ``--workers 2``), each task with 5G:
room for the course's 4 GiB box bound plus the grader beside it in the
task's cgroup.  Each task grades its submission on the node, with the
boxes made inside the Slurm task (the task's own cgroups hold the box's).
Then the same verdicts as the local run: every attacked exercise 0, the
rest full marks, nothing reached in the outputs or feedback, loopback only,
each bound reached named, the course tree and the checks hashed unchanged,
no process left (the run's token, a box's uid, the launches of conftest's
TMPDIR) and no job left in squeue.
"""
from __future__ import annotations

import pytest

import hostile_submissions as hostile
from hostile_submissions import (  # noqa: F401 - the shared tests, run on this module's graded
    test_attacked_exercises_score_zero_the_rest_full_marks, test_cells_that_reach_a_bound_say_which,
    test_course_tree_and_code_unchanged, test_network_is_loopback_only, test_nothing_left_running,
    test_nothing_reached_leaks_into_outputs_or_feedback)
from slurm_helpers import parlab_jobs

pytestmark = [pytest.mark.slurm, pytest.mark.nbgrader, pytest.mark.timeout(1500)]

TOKEN = "hostile-slurm-test"


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    cls = hostile.make_class(tmp_path_factory.mktemp("hostile-slurm"), TOKEN)
    got = hostile.grade(cls, TOKEN, "--slurm", "--throttle", "2", "--mem-per-task", "5G")
    got["squeue"] = parlab_jobs()
    return got


def test_every_submission_graded_as_one_array(graded):
    hostile.test_every_submission_graded(graded)
    assert f"{len(hostile.ATTACKED)} to grade as a Slurm array of {len(hostile.ATTACKED)} tasks" in graded["out"]
    assert graded["squeue"] == [], "the array outlived its run"
