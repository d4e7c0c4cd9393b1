"""``parlab grade``: a class graded in parallel equals nbgrader graded serially, nothing lost.

One course (lab 00, the cheapest) gets four good submissions: right
answers, the blank release, a wrong answer from tests/wrong_answers, and
one whose answer cell kills the kernel (the student's fault: it keeps the
other exercises' points), plus bad input: invalid JSON, JSON that is not a
notebook, a changed cell id, an unknown student, a roster student who
handed in nothing.  The same four good submissions are graded the ordinary
way, ``nbgrader autograde --force`` then ``nbgrader generate_feedback
--force``, in the session's one serial grading (conftest.py's
``serial_lab00``, shared with tests/slurm/test_grade_array.py), beside the
runs below.

The parallel course is graded with 2 workers while one worker is killed by
its PID mid-way, then resumed.  Then every good submission has exactly one
score per cell, equal to nbgrader's, and the same feedback file (but for
the durations its cells print); the killed
one was listed as a grader failure and given no score before the resume;
each bad input has its own message; a third run grades nothing; a fourth,
``--student bo``, grades bo's unchanged submission again and no one else's;
and no process of any run is left.
"""
import os
import re
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from parlab.classgrade import run as scheduler
from class_course import (LAB00_KINDS, add_students, blanked_feedback, gradebook_scores, make_course, notebook, submit,
                          tool_env, with_changed_cell_id)
from nbgrader_harness import TOKEN_VAR, leftover_processes

pytestmark = [pytest.mark.nbgrader, pytest.mark.timeout(900)]

LAB = "00-setup"
GOOD = ["ada", "bo", "cy", "di"]  # right, blank, wrong weight_bytes, kills the kernel (class_course.LAB00_KINDS)
TOKEN = "grade-class-test"


def grade(root: Path, *args: str, kill: str | None = None) -> tuple[int, str]:
    """Run ``parlab grade LAB`` in ``root``; with ``kill``, SIGKILL that student's worker mid-way."""
    proc = subprocess.Popen([sys.executable, "-m", "parlab", "grade", LAB, *args], cwd=root,
                            env=tool_env(**{TOKEN_VAR: TOKEN}), stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = []
    for line in proc.stdout:
        lines.append(line)
        found = kill and re.search(rf"\s{kill}\s+grading\s+worker pid (\d+)", line)
        if found:
            time.sleep(4)  # inside nbgrader by then: the notebook is being graded
            os.kill(int(found.group(1)), signal.SIGKILL)
    return proc.wait(timeout=600), "".join(lines)


@pytest.fixture(scope="module")
def courses(tmp_path_factory, serial_lab00):
    assert set(GOOD) == set(LAB00_KINDS)
    parallel = make_course(tmp_path_factory.mktemp("grade-class") / "parallel", [LAB])
    add_students(parallel, GOOD + ["ed", "fay", "gus", "hal"])  # ed hands in nothing
    for student in GOOD:
        submit(parallel, student, LAB, serial_lab00.notebooks[student])  # the very files nbgrader grades
    submit(parallel, "fay", LAB, b'{"cells": [ not json')
    submit(parallel, "gus", LAB, b'{"hello": "world"}')
    submit(parallel, "hal", LAB, with_changed_cell_id(notebook(LAB, parallel), "weight_bytes-test", "mine"))
    submit(parallel, "ivy", LAB, notebook(LAB, parallel))  # not on the roster
    runs = {}
    for name, args, kill in (("killed", ("--workers", "2"), "ada"), ("resumed", ("--workers", "2", "--resume"), None),
                             ("again", ("--workers", "2"), None), ("one", ("--student", "bo"), None)):
        start = time.perf_counter()
        if name == "one":
            runs["before one"] = gradebook_scores(parallel, LAB)
        runs[name] = grade(parallel, *args, kill=kill)
        if name == "killed":
            runs["after kill"] = gradebook_scores(parallel, LAB)
        print(f"parlab grade ({name}): {time.perf_counter() - start:.1f} s\n{runs[name][1]}")
    return serial_lab00.graded(), parallel, runs


def test_killed_worker_costs_only_its_submission(courses):
    _, _, runs = courses
    rc, out = runs["killed"]
    assert rc == 1, out
    assert re.search(r"ada: the worker died \(killed by signal 9\)", out), out
    assert "ada" not in runs["after kill"], "a grader failure must not become a score"
    assert set(runs["after kill"]) == set(GOOD) - {"ada"}, out


def test_resume_grades_only_what_is_missing(courses):
    _, _, runs = courses
    rc, out = runs["resumed"]
    assert rc == 0, out
    assert "1 to grade" in out and re.search(r"\sada\s+done", out), out
    assert not re.search(r"\s(bo|cy|di)\s+(grading|done)", out), out


def test_scores_equal_serial_nbgrader(courses):
    serial, parallel, _ = courses
    want, got = gradebook_scores(serial, LAB), gradebook_scores(parallel, LAB)
    assert set(want) == set(GOOD)
    assert got == want
    assert got["ada"] and all(s == m for s, m in got["ada"].values())
    assert all(s == 0 for s, _ in got["bo"].values())
    assert got["cy"]["weight_bytes-test"][0] == 0 and got["cy"]["hello-test"][0] > 0
    assert got["di"]["training_state_bytes-test"][0] == 0 and got["di"]["days_to_train-test"][0] > 0


def test_one_score_per_cell(courses):
    _, parallel, _ = courses
    con = sqlite3.connect(parallel / "gradebook.db")
    try:
        dupes = con.execute("SELECT notebook_id, cell_id, COUNT(*) FROM grade GROUP BY notebook_id, cell_id "
                            "HAVING COUNT(*) > 1").fetchall()
        per_student = con.execute("SELECT COUNT(*) FROM submitted_assignment").fetchone()[0]
        cells = con.execute("SELECT COUNT(*) FROM grade_cells").fetchone()[0]
        grades = con.execute("SELECT COUNT(*) FROM grade").fetchone()[0]
    finally:
        con.close()
    assert not dupes
    assert per_student == len(GOOD) and grades == cells * len(GOOD)


def test_feedback_matches_serial(courses):
    """The same HTML as nbgrader's, once the numbers the cells printed are blanked."""
    serial, parallel, _ = courses
    for student in GOOD:
        name = f"feedback/{student}/{LAB}/{LAB}.html"
        want, got = (blanked_feedback((root / name).read_text()) for root in (serial, parallel))
        at = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
        assert got == want, (f"{student}'s feedback differs from nbgrader's at character {at}: "
                             f"parlab grade {got[max(0, at - 200):at + 200]!r} | nbgrader {want[max(0, at - 200):at + 200]!r}")
        assert blanked_feedback("in 4.9 s, in 2 ms, 3e9 B") == "in T, in T, T B"
        assert blanked_feedback("The other ranks:\n  rank 1: still starting up</pre>") == \
            "The other ranks:\n  rank T: …</pre>"


def test_bad_input_each_has_its_message(courses):
    _, parallel, runs = courses
    _, out = runs["killed"]
    assert re.search(r"fay: .*is not valid JSON", out), out
    assert re.search(r"gus: .*is JSON but not a Jupyter notebook", out), out
    assert re.search(r"hal: .*cell id 'mine' is not one of the assignment's", out), out
    assert re.search(r"ivy: unknown student 'ivy'.*nbgrader db student add ivy", out), out
    assert re.search(r"no submission from: ed", out), out
    assert not {"fay", "gus", "hal", "ivy"} & set(gradebook_scores(parallel, LAB))


def test_rerun_grades_nothing(courses):
    _, parallel, runs = courses
    rc, out = runs["again"]
    assert rc == 0, out
    assert "0 to grade" in out and f"{len(GOOD)} unchanged" in out, out


def test_one_student_regraded(courses):
    """--student bo grades bo's unchanged submission again, and no one else's; the gradebook keeps one score each."""
    _, parallel, runs = courses
    rc, out = runs["one"]
    assert rc == 0, out
    assert "1 to grade" in out and "0 unchanged" in out and re.search(r"\sbo\s+done", out), out
    assert not re.search(r"\s(ada|cy|di)\s+(grading|done)", out) and "no submission from" not in out, out
    assert gradebook_scores(parallel, LAB) == runs["before one"]
    proc = subprocess.run([sys.executable, "-m", "parlab", "grade", LAB, "--student", "ed", "--student", "zed"],
                          cwd=parallel, env=tool_env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert f"no submission of {LAB} from ed, zed" in proc.stderr and "nbgrader collect" in proc.stderr, proc.stderr


def test_missing_assignment(courses):
    _, parallel, _ = courses
    proc = subprocess.run([sys.executable, "-m", "parlab", "grade", "99-nope"], cwd=parallel, env=tool_env(),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "no assignment '99-nope'" in proc.stderr, proc.stderr


def test_no_process_left_behind(courses):
    deadline = time.monotonic() + 10
    while (left := leftover_processes(TOKEN)) and time.monotonic() < deadline:
        time.sleep(0.25)
    assert not left, f"processes of parlab grade still alive: {left}"


def test_default_worker_count_rule(monkeypatch):
    """cores // the lab's widest launch: lab 00 starts at most 3 ranks, lab 01 at most 5 (the tree's hidden case)."""
    assert scheduler.widest_launch("00-setup") == 3 and scheduler.widest_launch("01-collectives") == 5
    monkeypatch.setattr(os, "sched_getaffinity", lambda _: set(range(112)))
    assert scheduler.default_workers("01-collectives") == 22
    labs = sorted(p.name for p in (Path(__file__).resolve().parents[2] / "solutions").iterdir() if p.is_dir())
    assert all(3 <= scheduler.widest_launch(lab) <= 8 for lab in labs), labs  # every lab's graders are read
    monkeypatch.setattr(os, "sched_getaffinity", lambda _: {0, 1})
    assert scheduler.default_workers("00-setup") == 1
