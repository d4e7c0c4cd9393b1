"""A late submission under the hub's late policy: ``parlab grade`` scores it as ``nbgrader autograde`` does.

The hub's instructor config (``hub/instructor/nbgrader_config.py``, found
through ``JUPYTER_CONFIG_PATH`` as on the hub) names the course's late policy
(``hub/late_penalty.py``: a tenth of the notebook's score per started day).
Two identical courses laid out as on the hub (``~/parlab`` of the
instructor's home) hold a one-cell assignment due 2026-01-01 00:00 UTC and
the same submission, handed in 36 hours after the due date (two started
days).  One course is graded by serial ``nbgrader
autograde`` and ``generate_feedback``, the other by ``parlab grade``.  Both
gradebooks record the same lateness and penalty (2 of 3 points less
20 %: 1.6), and the feedback says so in both.  (The whole course's
parity with serial nbgrader, without late work, is tests/nbgrader/test_grade_class.py;
the hub tier grades a late lab 00 submission on a real hub.)
"""
from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from class_course import serial_autograde, tool_env

pytestmark = [pytest.mark.nbgrader, pytest.mark.timeout(600)]

REPO = Path(__file__).resolve().parents[2]
LAB = "late-lab"
DUE = "2026-01-01 00:00:00 UTC"
SUBMITTED = {"late": "2026-01-02 12:00:00.000000 UTC"}  # an on-time one: the hub tier


def _cell(source: str, **nbgrader) -> nbformat.NotebookNode:
    cell = nbformat.v4.new_code_cell(source)
    cell.metadata["nbgrader"] = dict(nbgrader, schema_version=3, locked=not nbgrader.get("solution", False))
    return cell


def _source_notebook() -> nbformat.NotebookNode:
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.cells = [
        _cell("### BEGIN SOLUTION\nx = 1\n### END SOLUTION", grade=False, solution=True, grade_id="answer"),
        _cell("assert x == 1", grade=True, solution=False, grade_id="x-is-one", points=2),
        _cell("assert x == 2, 'x is not 2'", grade=True, solution=False, grade_id="x-is-two", points=1),
    ]
    return nb


def hub_env(home: Path) -> dict:
    """The instructor's environment on the hub (hub/course_hub.py's server_env), with this home."""
    return tool_env(HOME=str(home), JUPYTER_CONFIG_PATH=str(REPO / "hub" / "instructor"),
                    PARLAB_EXCHANGE=str(home / "exchange"))


def _run(argv: list[str], cwd: Path, env: dict) -> str:
    proc = subprocess.run(argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=600)
    assert proc.returncode == 0, f"{' '.join(argv)} exited {proc.returncode}:\n{proc.stdout[-4000:]}"
    return proc.stdout


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    base = tmp_path_factory.mktemp("late")
    homes = {"serial": base / "serial", "parallel": base / "parallel"}
    course = homes["serial"] / "parlab"
    (course / "solutions" / LAB).mkdir(parents=True)
    shutil.copy(REPO / "nbgrader_config.py", course / "nbgrader_config.py")
    nbformat.write(_source_notebook(), course / "solutions" / LAB / f"{LAB}.ipynb")
    env = hub_env(homes["serial"])
    _run([sys.executable, "-m", "nbgrader", "generate_assignment", LAB], course, env)
    from nbgrader.api import Gradebook

    with Gradebook(f"sqlite:///{course / 'gradebook.db'}", "parlab") as gb:  # nbgrader db assignment add --duedate
        gb.update_or_create_assignment(LAB, duedate=DUE)
    released = nbformat.read(course / "labs" / LAB / f"{LAB}.ipynb", as_version=4)
    released.cells[0].source = "x = 1"
    for student, stamp in SUBMITTED.items():
        folder = course / "submitted" / student / LAB
        folder.mkdir(parents=True)
        nbformat.write(released, folder / f"{LAB}.ipynb")
        (folder / "timestamp.txt").write_text(stamp)
    shutil.copytree(course, homes["parallel"] / "parlab")  # the same files and gradebook

    serial_autograde(course, LAB, env=env)
    parallel = homes["parallel"] / "parlab"
    report = _run([sys.executable, "-m", "parlab", "grade", LAB], parallel, hub_env(homes["parallel"]))
    return {"serial": course, "parallel": parallel, "report": report}


def lateness(course: Path) -> dict[str, tuple]:
    """{student: (seconds late, late penalty, score after it, max score)} from the course's gradebook."""
    from nbgrader.api import Gradebook

    with Gradebook(f"sqlite:///{course / 'gradebook.db'}", "parlab") as gb:
        return {s.student.id: (s.total_seconds_late, s.late_submission_penalty,
                               round(s.score - s.late_submission_penalty, 6), s.max_score)
                for s in gb.find_assignment(LAB).submissions}


def feedback_scores(course: Path, student: str) -> list[str]:
    html = (course / "feedback" / student / LAB / f"{LAB}.html").read_text()
    total = re.search(r"<h4>[^<]*\((Score: [^)]*)\)</h4>", html)
    return [total.group(1) if total else html[:2000]] + re.findall(r"Late submission penalty \(Score: [^)]*\)", html)


def test_late_submission_penalised_by_the_policy_as_serial_nbgrader_does(graded):
    serial, parallel = lateness(graded["serial"]), lateness(graded["parallel"])
    assert serial == {"late": (36 * 3600, 0.4, 1.6, 3.0)}, serial
    assert parallel == serial, graded["report"]
    for student in SUBMITTED:
        assert feedback_scores(graded["parallel"], student) == feedback_scores(graded["serial"], student)
    assert feedback_scores(graded["serial"], "late") == ["Score: 1.6 / 3.0",
                                                         "Late submission penalty (Score: -0.4)"]
