"""The one writer: a graded course copy into the course's gradebook, ``autograded/`` and ``feedback/``.

Only the scheduler calls ``merge``, one submission at a time, so the
gradebook never has two writers.  It copies what ``nbgrader autograde``
records for a submission (the timestamp, each cell's ``auto_score`` and
``needs_manual_grade``, each comment's ``auto_comment``, each notebook's
late penalty) onto the course's rows for that student and lab, created the
way autograde creates them, and commits once.  Grades given by hand
(``manual_score``) are left alone, as autograde leaves them.  Each row is
updated, never added twice, so merging a submission again (after a crash
between the commit and the marker) still leaves one score per cell.

Order: the folders first (each replaced whole), then the gradebook, then
the marker ``.parlab-grade/<lab>/graded/<student>.json`` that says the
merge finished.  A crash anywhere before the marker regrades the
submission on the next run.
"""
from __future__ import annotations

import json
import os
import shutil
import warnings
from pathlib import Path

from .inputs import Course, Submission


def marker(c: Course, lab: str, student: str) -> Path:
    return c.workdir / lab / "graded" / f"{student}.json"


def _replace_tree(src: Path, dest: Path) -> None:
    """``dest`` becomes a copy of ``src`` (copied beside it, then swapped in)."""
    if not src.is_dir():
        return
    part = dest.with_name(dest.name + ".parlab-part")
    old = dest.with_name(dest.name + ".parlab-old")
    shutil.rmtree(part, ignore_errors=True)
    shutil.rmtree(old, ignore_errors=True)
    shutil.copytree(src, part)
    dest.parent.mkdir(parents=True, exist_ok=True)
    if dest.exists():
        os.replace(dest, old)
    os.replace(part, dest)
    shutil.rmtree(old, ignore_errors=True)


def scores(gb, lab: str, student: str) -> dict[str, tuple[float, float]]:
    """{grade_id: (score, max_score)} of one submission in a gradebook."""
    sub = gb.find_submission(lab, student)
    return {g.name: (g.score, g.max_score) for nb in sub.notebooks for g in nb.grades}


def merge(c: Course, copy: Path, sub: Submission) -> dict[str, tuple[float, float]]:
    """Merge one graded copy; returns its scores per cell."""
    from nbgrader.api import Gradebook

    lab, student = sub.lab, sub.student
    for kind in ("autograded", "feedback"):
        real = getattr(c, kind)
        _replace_tree(copy / real.relative_to(c.root) / student / lab, real / student / lab)
    with Gradebook(f"sqlite:///{copy / 'gradebook.db'}", c.course_id) as src, \
            Gradebook(c.db_url, c.course_id) as dst, warnings.catch_warnings():
        # nbgrader's own add_submission trips SQLAlchemy's "not in session" autoflush warning
        warnings.filterwarnings("ignore", message=".*not in session", module="nbgrader")
        graded = src.find_submission(lab, student)
        student_row = graded.student
        dst.update_or_create_student(student, first_name=student_row.first_name,
                                     last_name=student_row.last_name, email=student_row.email,
                                     lms_user_id=student_row.lms_user_id)
        dst.update_or_create_submission(lab, student, timestamp=graded.timestamp)
        for nb in graded.notebooks:
            into = dst.find_submission_notebook(nb.name, lab, student)
            into.late_submission_penalty = nb.late_submission_penalty
            for g in nb.grades:
                row = dst.find_grade(g.name, nb.name, lab, student)
                row.auto_score, row.needs_manual_grade = g.auto_score, g.needs_manual_grade
            for k in nb.comments:
                dst.find_comment(k.name, nb.name, lab, student).auto_comment = k.auto_comment
        dst.db.commit()
        got = scores(dst, lab, student)
    done = marker(c, lab, student)
    done.parent.mkdir(parents=True, exist_ok=True)
    done.with_suffix(".part").write_text(json.dumps({"digest": sub.digest, "scores": got}))
    os.replace(done.with_suffix(".part"), done)
    return got


def up_to_date(c: Course, sub: Submission) -> bool:
    """Whether this exact hand-in was merged before and its grade is still in place."""
    from nbgrader.api import Gradebook, MissingEntry

    try:
        recorded = json.loads(marker(c, sub.lab, sub.student).read_text())
    except (OSError, ValueError):
        return False
    if recorded.get("digest") != sub.digest or not (c.autograded / sub.student / sub.lab).is_dir():
        return False
    with Gradebook(c.db_url, c.course_id) as gb:
        try:
            gb.find_submission(sub.lab, sub.student)
        except MissingEntry:
            return False
    return True
