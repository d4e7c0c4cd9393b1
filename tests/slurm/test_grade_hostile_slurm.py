"""The hostile class graded by ``parlab grade --slurm``: one array job through the private cluster of conftest.py.

Part of the class of tests/nbgrader/test_hostile_submissions.py
(hostile_submissions.py) goes through one ``sbatch --array`` job, one task
per submission, at most two at once (``--throttle 2``, as the local run's
``--workers 2``), each task with 5G: room for the course's 4 GiB box bound
plus the grader beside it in the task's cgroup.  Each task grades its
submission on the node, with the boxes made inside the Slurm task (the
task's own cgroups hold the box's).  Graded here: h3 (claims points through
nbgrader's metadata, a fork bomb, fills the disk), h4 (30 GB, sleeps
forever, FIFOs in its hand-in folder) and the correct zz graded after them.  Then the same verdicts as
the local run: every attacked exercise 0, the rest full marks, each bound
reached named, the course tree and the checks hashed unchanged, no process
left (the run's token, a box's uid, the launches of conftest's TMPDIR) and
no job left in squeue.

Left out on purpose, checked on the local path only: h1 (the filesystem:
writes the checks and the gradebook, reads the solutions and another
submission) and h2 (the pid and network namespaces: kills the grader's
parent, points the launcher at the grader, connects outside loopback);
also h5 (a folder holding links), refused by ``plan.select``, which both
schedulers run before anything is queued (checked locally and as a
non-root user).  A Slurm task grades each submission with the same
worker, in the same course copy, in the same boxes as a local worker
(parlab/classgrade/task.py); what the Slurm path changes is where the boxes' cgroups are made (inside the
task's), which is what the memory bound, the process bound and the cell
timeout's kill of h3 and h4 meet.
"""
from __future__ import annotations

import pytest

import hostile_submissions as hostile
from hostile_submissions import (  # noqa: F401 - the shared tests, run on this module's graded
    test_a_fifo_hand_in_costs_its_exercise_and_no_wait,
    test_attacked_exercises_score_zero_the_rest_full_marks, test_cells_that_reach_a_bound_say_which,
    test_course_tree_and_code_unchanged, test_nothing_left_running)
from slurm_helpers import parlab_jobs

pytestmark = [pytest.mark.slurm, pytest.mark.nbgrader, pytest.mark.timeout(1500)]

TOKEN = "hostile-slurm-test"
STUDENTS = ("h3", "h4", "zz")


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    cls = hostile.make_class(tmp_path_factory.mktemp("hostile-slurm"), TOKEN, STUDENTS)
    got = hostile.grade(cls, TOKEN, "--slurm", "--throttle", "2", "--mem-per-task", "5G")
    got["squeue"] = parlab_jobs()
    return got


def test_every_submission_graded_as_one_array(graded):
    hostile.test_every_submission_graded(graded)
    assert f"{len(STUDENTS)} to grade as a Slurm array of {len(STUDENTS)} tasks" in graded["out"]
    assert graded["squeue"] == [], "the array outlived its run"
