"""``parlab grade LAB --slurm``: the class graded as a Slurm array job equals nbgrader graded serially.

One course (lab 00) gets two submissions, right answers (ada) and a wrong
one from tests/wrong_answers (cy); the same files are graded the ordinary
way (``nbgrader autograde --force``, then ``generate_feedback``) in the
session's one serial grading (tests/conftest.py's ``serial_lab00``, which
tests/nbgrader/test_grade_class.py shares; in a thread beside the Slurm runs
when this module asks first).  The course is graded through the private
cluster of conftest.py, one array task per submission:

1. a run stopped with SIGTERM while a task grades: it cancels the array
   (squeue lists nothing of it at once) and records no score;
2. a run in which one task is cancelled with ``scancel JOB_TASK`` while it
   grades: only that submission is lost, listed as a grader failure, and
   it gets no score;
3. a second run grades only that one; a third grades nothing.

Then every score equals nbgrader's, with one grade row per cell, the
feedback matches nbgrader's (numbers the cells print blanked, as in
tests/nbgrader/test_grade_class.py), Slurm that is not reachable or cannot hold the
request is refused before anything is queued, and no process of any run is
left (here, and conftest's check of squeue and the launches).
"""
import contextlib
import io
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from parlab.classgrade import cli
from class_course import (LAB00_KINDS, add_students, blanked_feedback, duplicate_grades, gradebook_scores, make_course,
                          submit, tool_env)
from nbgrader_harness import TOKEN_VAR, leftover_processes
from slurm_helpers import parlab_jobs

pytestmark = [pytest.mark.slurm, pytest.mark.nbgrader, pytest.mark.timeout(600)]

LAB = "00-setup"
GOOD = ["ada", "cy"]  # right; wrong weight_bytes (class_course.LAB00_KINDS)
TOKEN = "grade-array-test"
GRADING = re.compile(r"\s(\w+)\s+grading\s+task (\d+) of Slurm job (\d+)")


def grade(root: Path, *args: str, when_grading=None, env: dict | None = None) -> tuple[int, str]:
    """``parlab grade LAB --slurm ARGS`` in ``root``; ``when_grading(proc, student, task, job)`` per started task."""
    proc = subprocess.Popen([sys.executable, "-m", "parlab", "grade", LAB, "--slurm", *args], cwd=root,
                            env=env or tool_env(**{TOKEN_VAR: TOKEN}), stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if when_grading and (found := GRADING.search(line)):
            when_grading(proc, *found.groups())
    return proc.wait(timeout=300), "".join(lines)


def stop_command(proc, student, task, job):
    if proc.returncode is None and not getattr(proc, "stopped", False):  # once
        proc.stopped = True
        time.sleep(2)
        proc.send_signal(signal.SIGTERM)


def cancel_cy(proc, student, task, job):
    if student == "cy":
        time.sleep(3)  # inside nbgrader by then
        subprocess.run(["scancel", f"{job}_{task}"], check=True)


def grade_here(root: Path, *args: str) -> tuple[int, str]:
    """``parlab grade LAB --slurm ARGS`` in this process (no start-up to pay), for runs that queue nothing."""
    out, saved = io.StringIO(), signal.getsignal(signal.SIGTERM)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            rc = cli.main([LAB, "--slurm", "--root", str(root), *args])
    finally:
        signal.signal(signal.SIGTERM, saved)
    return rc, out.getvalue()


def serial_scores(serial: Path) -> dict:
    """The serial grading's scores of this module's students (it grades the other kinds too)."""
    return {student: cells for student, cells in gradebook_scores(serial, LAB).items() if student in GOOD}


@pytest.fixture(scope="module")
def courses(tmp_path_factory, serial_lab00):
    assert set(GOOD) <= set(LAB00_KINDS)
    array = make_course(tmp_path_factory.mktemp("grade-array") / "array", [LAB])
    add_students(array, GOOD)
    for student in GOOD:
        submit(array, student, LAB, serial_lab00.notebooks[student])  # the very files nbgrader grades
    runs = {}
    for name, args, hook in (("stopped", ("--cpus-per-task", "1"), stop_command),
                             ("cancelled", ("--cpus-per-task", "1"), cancel_cy), ("resumed", (), None)):
        start = time.perf_counter()
        runs[name] = grade(array, *args, when_grading=hook)
        runs[f"{name}: squeue"] = parlab_jobs()
        runs[f"{name}: scores"] = gradebook_scores(array, LAB)
        print(f"parlab grade --slurm ({name}): {time.perf_counter() - start:.1f} s\n{runs[name][1]}")
    runs["again"] = grade_here(array)
    return serial_lab00.graded(), array, runs


def test_stopping_the_command_cancels_the_array(courses):
    _, _, runs = courses
    rc, out = runs["stopped"]
    assert rc == 143 and GRADING.search(out), out
    assert runs["stopped: squeue"] == [], "the array outlived the command that was stopped"
    assert runs["stopped: scores"] == {}, out


def test_a_cancelled_task_costs_only_its_submission(courses):
    _, _, runs = courses
    rc, out = runs["cancelled"]
    assert rc == 1, out
    assert re.search(r"cy: Slurm task 1 of job \d+ ended while grading it: it was cancelled \(scancel\)", out), out
    assert set(runs["cancelled: scores"]) == {"ada"}, "a grader failure must not become a score"
    assert runs["cancelled: squeue"] == [], out


def test_the_next_run_grades_only_that_one_then_nothing(courses):
    _, _, runs = courses
    rc, out = runs["resumed"]
    assert rc == 0 and "1 to grade as a Slurm array of 1 task" in out, out
    assert re.search(r"\scy\s+done", out) and not re.search(r"\sada\s+(grading|done)", out), out
    rc, out = runs["again"]
    assert rc == 0 and "0 to grade" in out and f"{len(GOOD)} unchanged" in out, out


def test_scores_and_feedback_equal_serial_nbgrader(courses):
    serial, array, _ = courses
    want, got = serial_scores(serial), gradebook_scores(array, LAB)
    assert set(want) == set(GOOD) and got == want
    assert all(s == m for s, m in got["ada"].values())
    assert got["cy"]["weight_bytes-test"][0] == 0 and got["cy"]["hello-test"][0] > 0
    assert duplicate_grades(array) == []
    for student in GOOD:
        name = f"feedback/{student}/{LAB}/{LAB}.html"
        assert blanked_feedback((array / name).read_text()) == blanked_feedback((serial / name).read_text()), student


def refused(array: Path, *args: str) -> str:
    rc, out = grade_here(array, "--force", *args)
    assert rc == 2, out
    return out


def test_slurm_that_cannot_take_the_array_is_refused_before_queuing(courses, tmp_path, monkeypatch):
    _, array, _ = courses
    assert "no partition 'nope'; sinfo lists gpu, two" in refused(array, "--partition", "nope")
    assert "--cpus-per-task 64 but the nodes of partition 'gpu' have at most" in \
        refused(array, "--cpus-per-task", "64")
    conf = re.sub(r"SlurmctldPort=\d+", "SlurmctldPort=1", open(os.environ["SLURM_CONF"]).read())  # nobody there
    (tmp_path / "slurm.conf").write_text(conf)
    monkeypatch.setenv("SLURM_CONF", str(tmp_path / "slurm.conf"))
    assert re.search(r"`sinfo .*` failed.*SLURM_CONF.*leave out --slurm", refused(array))
    (tmp_path / "bwrap").symlink_to(shutil.which("bwrap"))  # the grading boundary's, checked first
    monkeypatch.setenv("PATH", str(tmp_path))
    assert "'sbatch', which is not on PATH" in refused(array)
    assert gradebook_scores(array, LAB) == serial_scores(courses[0])  # conftest checks squeue after
    assert not (array / ".parlab-grade" / LAB / "slurm" / "job.json").exists()


def test_no_process_left_behind(courses):
    deadline = time.monotonic() + 10
    while (left := leftover_processes(TOKEN)) and time.monotonic() < deadline:
        time.sleep(0.25)
    assert not left, f"processes of parlab grade --slurm still alive: {left}"
