"""A throw-away course with a class of submissions, for ``parlab grade`` tests and benchmarks.

    root = make_course(tmp / "course", ["00-setup"])     # config, solutions/, labs/, gradebook.db
    add_students(root, ["ada", "bo"])
    submit(root, "ada", "00-setup", notebook("00-setup", root))                       # right answers
    submit(root, "bo", "00-setup", notebook("00-setup", root, wrong=("weight_bytes", fixture)))

Every submission starts from the student version this course generated, cut
to its graded cells (``nbgrader_harness.graded_cells_only``: nbgrader scores
only those), with each answer cell holding the solution's code, except:

- ``blank=True``: the answer cells as released (stubs that raise);
- ``wrong=(exercise, fixture)``: that exercise answered by a wrong-answer
  fixture from ``tests/wrong_answers/labNN.py`` (the fixture module's source
  goes first in the cell, so its helpers are defined; then the answer's
  name is bound to the fixture);
- ``kill=exercise``: that answer cell ends the kernel (``os._exit(1)``), a
  student's fault that costs that exercise only.

``serial_autograde`` grades a course the ordinary way, ``nbgrader autograde
LAB --force`` then ``nbgrader generate_feedback LAB --force``.

``SerialLab00`` is the one serial grading the class-grading tests compare
``parlab grade`` with (tests/conftest.py's session fixture ``serial_lab00``):
a course holding one lab 00 submission of each kind (``LAB00_KINDS``),
graded the ordinary way in a thread while the test that first asks for it
runs its own gradings; each test submits the very same notebooks, under the
same student names, to its own course.
"""
from __future__ import annotations

import atexit
import concurrent.futures
import importlib
import inspect
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import nbformat

from nbgrader_harness import REPO, _run_here, graded_cells_only, source_notebook


def tool_env(**extra) -> dict:
    """The environment nbgrader needs (this venv's ``alembic`` on PATH), one thread per rank."""
    env = dict(os.environ, OMP_NUM_THREADS="1", **extra)
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    return env


#: {labs: a course generated once in this process}: generating costs an nbgrader process (about 6 s).
_GENERATED: dict[tuple[str, ...], Path] = {}


def make_course(root: Path, labs: list[str], timeout: float = 300) -> Path:
    """A course root holding the repository's config and these labs, generated (gradebook included).

    The first course of a set of labs is generated with nbgrader; later ones are
    copies of it (the generated files and gradebook.db hold no absolute path).
    """
    key = tuple(labs)
    if key not in _GENERATED:
        template = Path(tempfile.mkdtemp(prefix="parlab-course-")) / "course"
        template.mkdir()
        atexit.register(shutil.rmtree, template.parent, True)
        shutil.copy(REPO / "nbgrader_config.py", template / "nbgrader_config.py")
        for lab in labs:
            shutil.copytree(REPO / "solutions" / lab, template / "solutions" / lab,
                            ignore=shutil.ignore_patterns(".ipynb_checkpoints", "__pycache__"))
        _run_here("release", template, labs, tool_env(), timeout)
        _GENERATED[key] = template
    shutil.copytree(_GENERATED[key], root, dirs_exist_ok=True)
    return root


def add_students(root: Path, students: list[str]) -> None:
    from nbgrader.api import Gradebook

    with Gradebook(f"sqlite:///{root / 'gradebook.db'}", "parlab") as gb:
        for student in students:
            gb.update_or_create_student(student)


def _answer_name(lab: str, exercise: str) -> str:
    module = importlib.import_module(f"parlab.grading.lab{lab[:2]}")
    for obj in vars(module).values():
        ex = getattr(obj, "exercise", None)
        if ex is not None and ex.key == f"lab{lab[:2]}.{exercise}":
            return ex.answer
    raise KeyError(f"no exercise {exercise!r} in {lab}")


def _defines(cell, name: str) -> bool:
    return any(line.startswith((f"def {name}(", f"class {name}(", f"class {name}:"))
               for line in cell.source.splitlines())


def notebook(lab: str, root: Path, blank: bool = False, wrong: tuple | None = None,
             kill: str | None = None) -> nbformat.NotebookNode:
    """A student's notebook for ``lab`` (see the module docstring)."""
    nb = nbformat.read(root / "labs" / lab / source_notebook(lab).name, as_version=4)
    graded_cells_only(nb)
    if blank:
        return nb
    solved = {c.metadata["nbgrader"]["grade_id"]: c.source
              for c in nbformat.read(source_notebook(lab), as_version=4).cells
              if c.metadata.get("nbgrader", {}).get("solution")}
    for cell in nb.cells:
        grade_id = cell.metadata.get("nbgrader", {}).get("grade_id")
        if cell.metadata.get("nbgrader", {}).get("solution") and grade_id in solved:
            cell.source = solved[grade_id]
    if wrong:
        exercise, fixture = wrong
        name = _answer_name(lab, exercise)
        cell = next(c for c in nb.cells if c.metadata.get("nbgrader", {}).get("solution") and _defines(c, name))
        cell.source = f"{inspect.getsource(inspect.getmodule(fixture))}\n\n{name} = {fixture.__name__}\n"
    if kill:
        name = _answer_name(lab, kill)
        cell = next(c for c in nb.cells if c.metadata.get("nbgrader", {}).get("solution") and _defines(c, name))
        cell.source = "import os\nos._exit(1)\n" + cell.source
    return nb


def submit(root: Path, student: str, lab: str, content) -> Path:
    """Put a notebook (or raw bytes, for bad input) at submitted/<student>/<lab>/<notebook>."""
    dest = root / "submitted" / student / lab / source_notebook(lab).name
    dest.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(content, bytes):
        dest.write_bytes(content)
    else:
        nbformat.write(content, dest)
    return dest


def with_changed_cell_id(nb, old: str, new: str):
    """A copy of ``nb`` whose graded cell ``old`` was renamed ``new``."""
    nb = nbformat.from_dict(json.loads(nbformat.writes(nb)))
    for cell in nb.cells:
        if cell.metadata.get("nbgrader", {}).get("grade_id") == old:
            cell.metadata["nbgrader"]["grade_id"] = new
    return nb


def serial_autograde(root: Path, lab: str, env: dict | None = None, timeout: float = 1800) -> float:
    """``nbgrader autograde LAB --force`` then ``nbgrader generate_feedback LAB --force``; wall seconds."""
    start = time.perf_counter()
    for step in ("autograde", "generate_feedback"):
        proc = subprocess.run([sys.executable, "-m", "nbgrader", step, lab, "--force"], cwd=root,
                              env=env or tool_env(), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, timeout=timeout)
        if proc.returncode != 0:
            raise RuntimeError(f"nbgrader {step} {lab} failed (exit {proc.returncode}):\n{proc.stdout[-4000:]}")
    return time.perf_counter() - start


#: The good lab 00 submissions the class-grading tests compare with serial nbgrader, one of each
#: kind, by student: right answers, the blank release, a wrong answer from tests/wrong_answers,
#: and an answer cell that kills the kernel (the student's fault: the other exercises keep their points).
LAB00_KINDS = {"ada": "right", "bo": "blank", "cy": "wrong weight_bytes", "di": "kills the kernel"}


@dataclass
class SerialLab00:
    """A lab 00 course holding ``notebooks`` (one per ``LAB00_KINDS`` student), graded serially in a thread."""

    root: Path
    notebooks: dict
    grading: concurrent.futures.Future

    @classmethod
    def start(cls, folder: Path) -> "SerialLab00":
        """Make the course and submit; nbgrader grades it meanwhile (the callers' own runs wait on
        launches and start-ups, so the two share the machine)."""
        from wrong_answers import lab00 as wrong

        lab = "00-setup"
        root = make_course(folder, [lab])
        notebooks = {"ada": notebook(lab, root), "bo": notebook(lab, root, blank=True),
                     "cy": notebook(lab, root, wrong=("weight_bytes", wrong.weight_bits)),
                     "di": notebook(lab, root, kill="training_state_bytes")}
        assert set(notebooks) == set(LAB00_KINDS)
        add_students(root, list(notebooks))
        for student, nb in notebooks.items():
            submit(root, student, lab, nb)
        grading = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="serial-lab00").submit(
            serial_autograde, root, lab)
        return cls(root, notebooks, grading)

    def graded(self) -> Path:
        """The course root, once nbgrader has graded it (its error, if it failed)."""
        seconds = self.grading.result()
        print(f"serial nbgrader autograde + generate_feedback, {len(self.notebooks)} submissions "
              f"(beside the first caller's runs): {seconds:.1f} s")
        return self.root


def gradebook_scores(root: Path, lab: str) -> dict[str, dict[str, tuple[float, float]]]:
    """{student: {grade_id: (score, max_score)}} of every submission of ``lab`` in the course."""
    from nbgrader.api import Gradebook

    with Gradebook(f"sqlite:///{root / 'gradebook.db'}", "parlab") as gb:
        return {sub.student.id: {g.name: (g.score, g.max_score) for nb in sub.notebooks for g in nb.grades}
                for sub in gb.find_assignment(lab).submissions}


def duplicate_grades(root: Path) -> list[tuple]:
    """(notebook, cell, count) of every cell with more than one grade row in the course's gradebook."""
    import sqlite3

    con = sqlite3.connect(root / "gradebook.db")
    try:
        return con.execute("SELECT notebook_id, cell_id, COUNT(*) FROM grade GROUP BY notebook_id, cell_id "
                           "HAVING COUNT(*) > 1").fetchall()
    finally:
        con.close()


#: Numbers the notebook's cells print are partly measured (durations, rates, memory), so they
#: differ run to run, and more so on a loaded machine; every score is compared exactly in
#: test_scores_equal_serial, so here the numbers are blanked and the rest must match.
#: The first rank to fail is the one named ("rank 1 failed"), a race, and a numbered prompt too:
#: the cell that kills the kernel shows "In [7]" or "In [ ]" by whether the kernel's
#: execute_input message got out before it died (seen: serial 7, parallel blank).
DURATION = re.compile(r"In\xa0\[[^\]]*\]|\d+(\.\d+)?(e[-+]?\d+)?( m?s\b)?")
#: What the other ranks were doing when the first one failed is a race too (seen: serial
#: "rank 1: raised NotImplementedError", parallel "rank 1: still starting up").
OTHER_RANK = re.compile(r"(?m)^  rank T: [^<\n]*")


def blanked_feedback(html: str) -> str:
    return OTHER_RANK.sub("  rank T: …", DURATION.sub("T", html))
