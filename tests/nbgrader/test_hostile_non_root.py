"""Hostile submissions graded by an instructor who is not root: bwrap in a user namespace, no uid of its own.

A throw-away Unix user (unix_users.py's ``users``: made with useradd,
removed afterwards) owns a copy of the hostile course and runs ``parlab
grade --workers 2`` on part of the class of hostile_submissions.py: h1
(writes the checks and the gradebook it owns, reads the solutions and
another submission it owns), h2 (from the kernel, kills the grader's
parent; from a rank, names the grader in its pid file, SIGKILLs every
process it can see and fills its launch folder; connects outside
loopback), h4 (30 GB, sleeps forever, FIFOs in its hand-in folder), h5
(links to a root-only file and to the solutions: refused before anything
runs) and the correct zz.
There the boxes run as that user in a user namespace, cannot make cgroups
(memory is bounded per process by RLIMIT_AS, so h4's cell ends in a
MemoryError that names the bound) and keep the same filesystem, network,
pid-namespace and environment rules: h2's rank, with the grader's own uid,
sees only its own box's processes and kills nothing.  Checked: the same
verdicts as the root run for these submissions, the course tree and the
checks unchanged, and no process of the user or of the run left.

Left out on purpose: h3 (without a pids cgroup, RLIMIT_NPROC stops the fork
bomb, but no note names that bound).
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

import hostile_submissions as hostile
from hostile_submissions import (  # noqa: F401 - the shared tests, run on this module's graded
    test_a_fifo_hand_in_costs_its_exercise_and_no_wait, test_a_submission_holding_links_is_refused_unread,
    test_attacked_exercises_score_zero_the_rest_full_marks, test_cells_that_reach_a_bound_say_which,
    test_course_tree_and_code_unchanged, test_every_submission_graded, test_network_is_loopback_only,
    test_nothing_left_running,
    test_nothing_reached_leaks_into_outputs_or_feedback)
from nbgrader_harness import TOKEN_VAR
from unix_users import as_user, users  # noqa: F401 - users is the throw-away users' fixture

pytestmark = [pytest.mark.nbgrader, pytest.mark.timeout(1200)]

TOKEN = "hostile-non-root-test"
STUDENTS = ("h1", "h2", "h4", "h5", "zz")


@pytest.fixture(scope="module")
def graded(users):
    teacher = users["alice"]
    # in /tmp itself: pytest's own folder is root's, closed to the user
    base = Path(tempfile.mkdtemp(prefix="parlab-non-root-", dir="/tmp"))
    try:
        base.chmod(0o755)
        cls = hostile.make_class(base, TOKEN, STUDENTS)
        for folder in (base / "home", base / "tmp"):
            folder.mkdir()
        subprocess.run(["chown", "-R", f"{teacher.pw_uid}:{teacher.pw_gid}", str(base / "course"),
                        str(base / "home"), str(base / "tmp")], check=True)
        env = {"PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '/usr/bin:/bin')}",
               "HOME": str(base / "home"), "TMPDIR": str(base / "tmp"), "LANG": "C.UTF-8",
               "OMP_NUM_THREADS": "1", "PYTHONDONTWRITEBYTECODE": "1", TOKEN_VAR: TOKEN}
        probe = subprocess.run(as_user(teacher.pw_name, ["bwrap", "--ro-bind", "/", "/", "--unshare-net", "true"],
                                       env), env=env, capture_output=True, text=True)
        if probe.returncode != 0:
            pytest.skip("bwrap cannot make a user namespace as an unprivileged user here, so a non-root "
                        f"instructor cannot grade on this machine (sysctl user.max_user_namespaces): {probe.stderr}")
        got = hostile.grade(cls, TOKEN, "--workers", "2", prefix=tuple(as_user(teacher.pw_name, [], env)), env=env)
        got["uids"] = (teacher.pw_uid,)
        yield got
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_memory_bound_is_per_process_without_a_cgroup(graded):
    assert "may use at most 4096 MiB" in hostile.outputs(graded["class"].root, "h4")  # RLIMIT_AS's MemoryError
