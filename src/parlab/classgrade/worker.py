"""Grade one submission in a copy of the course: ``python -m parlab.classgrade.worker COPY LAB STUDENT``.

``prepare`` builds the copy under ``.parlab-grade/<lab>/<student>/``: the
course's ``nbgrader_config.py``, the lab's source folder, the student's
submitted folder and a gradebook of its own (a snapshot of the course's,
which holds the assignment and the roster).  The worker process then runs
what ``nbgrader autograde LAB --student STUDENT --force`` and ``nbgrader
generate_feedback LAB --student STUDENT --force`` run, in that copy, with
the course's own execute step (``parlab.grading.autograde.GuardedExecute``:
each notebook's checks are graded in a sandbox process, and a cell that kills
the kernel costs only its own points).  Nothing here writes to the course
itself; the scheduler merges the copy afterwards (``merge``).

The worker writes ``result.json`` in the copy when it ends:
``{"ok": true, "seconds": ...}`` or ``{"ok": false, "error": ...}``.  No
result file means the worker died (killed, out of memory, the machine).
"""
from __future__ import annotations

import json
import logging
import os
import shutil
import sqlite3
import sys
import time
import traceback
from pathlib import Path

from .inputs import Course, Submission, load_config

RESULT = "result.json"
LOG = "worker.log"


def snapshot_gradebook(c: Course, dest: Path) -> None:
    """A consistent copy of the course's gradebook (SQLite's backup API, safe while it is written)."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    part = dest.with_suffix(".part")
    part.unlink(missing_ok=True)
    src = sqlite3.connect(f"file:{c.db_path}?mode=ro", uri=True)
    out = sqlite3.connect(part)
    try:
        src.backup(out)
    finally:
        out.close()
        src.close()
    os.replace(part, dest)


def copy_root(c: Course, sub: Submission) -> Path:
    return c.workdir / sub.lab / sub.student


def prepare(c: Course, sub: Submission, template_db: Path) -> Path:
    """A fresh course copy for one submission; returns its root."""
    root = copy_root(c, sub)
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    shutil.copy(c.root / "nbgrader_config.py", root / "nbgrader_config.py")
    shutil.copytree(c.source / sub.lab, root / c.source.relative_to(c.root) / sub.lab,
                    ignore=shutil.ignore_patterns(".ipynb_checkpoints", "__pycache__"))
    # links stay links (``inputs.find`` refused any; one made since is refused by GuardedExecute, unread)
    shutil.copytree(sub.folder, root / c.submitted.relative_to(c.root) / sub.student / sub.lab, symlinks=True)
    restore_cell_roles(c.source / sub.lab, root / c.submitted.relative_to(c.root) / sub.student / sub.lab)
    shutil.copy(template_db, root / "gradebook.db")
    (root / "digest").write_text(sub.digest)
    return root


#: What makes an nbgrader cell an answer or a test, and what it is worth: the assignment's, never the student's.
ROLE_KEYS = ("grade", "solution", "locked", "points", "task")


def restore_cell_roles(source: Path, submission: Path) -> None:
    """Give each graded cell of the copied submission the assignment's role and points (by its grade_id).

    A student who edits a cell's nbgrader metadata (an answer cell made a
    test worth 100 points, say) would otherwise make nbgrader fail on the
    submission, or grade a cell the assignment does not.
    """
    import nbformat

    for path in submission.glob("*.ipynb"):
        master = source / path.name
        if not master.is_file() or path.is_symlink() or not path.is_file():  # never written through a link
            continue
        roles = {m["grade_id"]: m for cell in nbformat.read(master, as_version=4).cells
                 if "grade_id" in (m := cell.get("metadata", {}).get("nbgrader", {}))}
        nb = nbformat.read(path, as_version=4)
        for cell in nb.cells:
            meta = cell.get("metadata", {}).get("nbgrader")
            if meta and meta.get("grade_id") in roles:
                for key in ROLE_KEYS:
                    meta.pop(key, None)
                    if key in roles[meta["grade_id"]]:
                        meta[key] = roles[meta["grade_id"]][key]
        nbformat.write(nb, path)


def command(root: Path, lab: str, student: str) -> list[str]:
    return [sys.executable, "-m", "parlab.classgrade.worker", str(root), lab, student]


def result(root: Path) -> dict | None:
    """What the worker wrote when it ended, or None if it died first."""
    try:
        return json.loads((root / RESULT).read_text())
    except (OSError, ValueError):
        return None


def log_tail(root: Path, chars: int = 1500) -> str:
    try:
        return (root / LOG).read_text(errors="replace")[-chars:]
    except OSError:
        return ""


def why_failed(root: Path, returncode: int | None, timed_out: float | None) -> str:
    """Why the worker of the copy at ``root`` gave no grade (its exit status, or its timeout)."""
    if timed_out:
        return f"grading took longer than {timed_out:g} s and was stopped (--timeout)"
    got = result(root)
    if got is None:
        how = f"killed by signal {-returncode}" if returncode is not None and returncode < 0 \
            else f"exit code {returncode}"
        return f"the worker died ({how}) before it finished; it is graded again on the next run"
    tail = log_tail(root, 400).strip().splitlines()
    return f"nbgrader could not grade it: {got.get('error', '?')}" + (f" | log: {tail[-1]}" if tail else "")


def grade(root: Path, lab: str, student: str) -> None:
    """Autograde and generate feedback for one student, in the course copy at ``root``."""
    from nbgrader.converters import Autograde, GenerateFeedback
    from nbgrader.coursedir import CourseDirectory

    bin_dir = str(Path(sys.executable).parent)  # nbgrader runs `alembic`: use this venv's
    os.environ["PATH"] = bin_dir + os.pathsep + os.environ.get("PATH", "")
    config = load_config(root)
    config.CourseDirectory.db_url = f"sqlite:///{root / 'gradebook.db'}"
    for step in (Autograde, GenerateFeedback):
        coursedir = CourseDirectory(config=config)
        coursedir.assignment_id = lab
        coursedir.student_id = student
        app = step(coursedir=coursedir, config=config)
        app.force = True
        app.start()  # raises NbGraderException (its log says why) when a notebook cannot be graded


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print(__doc__.splitlines()[0], file=sys.stderr)
        return 2
    root, lab, student = Path(argv[0]), argv[1], argv[2]
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(levelname)s %(message)s")
    start = time.perf_counter()
    os.chdir(root)
    try:
        grade(root, lab, student)
        out = {"ok": True, "seconds": time.perf_counter() - start}
    except BaseException as exc:  # noqa: BLE001 - any failure here is the grader's, reported by the scheduler
        traceback.print_exc()
        out = {"ok": False, "seconds": time.perf_counter() - start,
               "error": f"{type(exc).__name__}: {str(exc).strip()[-600:]}"}
    (root / (RESULT + ".part")).write_text(json.dumps(out))
    os.replace(root / (RESULT + ".part"), root / RESULT)
    return 0 if out["ok"] else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
