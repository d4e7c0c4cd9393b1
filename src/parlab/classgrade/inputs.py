"""The submissions of one lab, found and checked before anything is graded.

A course is the folder nbgrader runs in: its ``nbgrader_config.py`` names the
source folder, ``submitted/`` and the gradebook.  ``find`` lists every
``submitted/<student>/<lab>/`` folder and sorts it into a ``Submission`` to
grade or a ``Rejected`` with the reason, so one bad hand-in never stops the
others:

- anything in the folder that is not a plain file or folder: a symbolic
  link, a FIFO, a socket, a device, or a file with more than one hard link
  (grading as root, a copy made through any of them would hand the student
  a file they cannot read, or a read that never ends;
  ``parlab.plainfile.unsafe_entry``);
- a notebook of the assignment missing from the folder;
- a file that is not valid JSON, or JSON that is not a Jupyter notebook;
- changed cell ids: an nbgrader cell (answer or test) whose ``grade_id`` is
  not one of the assignment's, or appears twice (nbgrader matches a
  student's cells to the assignment's by that id);
- an unknown student: the gradebook lists students and this one is not
  among them (with an empty roster nbgrader creates students as it grades,
  and so does this).

A lab that is not an assignment of the course raises ``CourseError`` with
what to do.
"""
from __future__ import annotations

import hashlib
import json
import stat
from dataclasses import dataclass, field
from pathlib import Path

from ..plainfile import entries, read_plain, unsafe_entry

WORKDIR = ".parlab-grade"  # in the course root, git-ignored


class CourseError(Exception):
    """The course or the lab cannot be graded at all (the message says what to do)."""


@dataclass(frozen=True)
class Course:
    root: Path
    source: Path        # solutions/
    submitted: Path
    autograded: Path
    feedback: Path
    db_url: str
    course_id: str

    @property
    def workdir(self) -> Path:
        return self.root / WORKDIR

    @property
    def db_path(self) -> Path:
        if not self.db_url.startswith("sqlite:///"):
            raise CourseError(f"the gradebook is {self.db_url}; parlab grade needs nbgrader's "
                              "SQLite gradebook (CourseDirectory.db_url = sqlite:///...)")
        return Path(self.db_url[len("sqlite:///"):])


@dataclass(frozen=True)
class Submission:
    student: str
    lab: str
    folder: Path                      # submitted/<student>/<lab>
    digest: str                       # of every file in the folder: a changed hand-in regrades


@dataclass(frozen=True)
class Rejected:
    student: str
    lab: str
    reason: str


@dataclass
class Assignment:
    lab: str
    notebooks: dict[str, set[str]] = field(default_factory=dict)  # notebook name -> its grade_ids
    roster: set[str] = field(default_factory=set)


def load_config(root: Path):
    """The nbgrader config ``nbgrader autograde`` run in ``root`` would use, with the course root set to ``root``.

    As nbgrader does: each ``nbgrader_config.py`` on Jupyter's config path
    (``JUPYTER_CONFIG_PATH``, ``~/.jupyter``, the environment's and the
    system's; the first one found wins), then the course's on top.  (The
    hub's instructor config, for one, names the course's late policy.)
    """
    from jupyter_core.paths import jupyter_config_dir, jupyter_config_path
    from traitlets.config.loader import Config, ConfigFileNotFound, PyFileConfigLoader

    if not (root / "nbgrader_config.py").is_file():
        raise CourseError(f"no nbgrader_config.py in {root}: run parlab grade from the course root "
                          "(the folder with nbgrader_config.py), or pass --root")
    folders = jupyter_config_path()
    if jupyter_config_dir() not in folders:
        folders.insert(0, jupyter_config_dir())
    config = Config()
    for folder in [*reversed(folders), str(root)]:
        try:
            config.merge(PyFileConfigLoader("nbgrader_config.py", path=folder).load_config())
        except ConfigFileNotFound:
            continue
    config.CourseDirectory.root = str(root)
    return config


def course(root: Path) -> Course:
    from nbgrader.coursedir import CourseDirectory

    root = Path(root).resolve()
    cd = CourseDirectory(config=load_config(root))
    return Course(root=root, source=root / cd.source_directory, submitted=root / cd.submitted_directory,
                  autograded=root / cd.autograded_directory, feedback=root / cd.feedback_directory,
                  db_url=cd.db_url, course_id=cd.course_id)


def assignment(c: Course, lab: str) -> Assignment:
    """The lab's notebooks and cell ids from the gradebook, and the class roster."""
    from nbgrader.api import Gradebook, MissingEntry

    labs = sorted(p.name for p in c.source.iterdir() if p.is_dir()) if c.source.is_dir() else []
    if lab not in labs:
        raise CourseError(f"no assignment {lab!r}: there is no folder {c.source.name}/{lab}. "
                          f"Assignments: {', '.join(labs) or 'none'}")
    if not c.db_path.is_file():
        raise CourseError(f"no gradebook at {c.db_path}: run `make release` (or `nbgrader "
                          f"generate_assignment {lab}`) in {c.root} first")
    with Gradebook(c.db_url, c.course_id) as gb:
        try:
            found = gb.find_assignment(lab)
        except MissingEntry:
            raise CourseError(f"assignment {lab!r} is not in the gradebook: run `make release` "
                              f"(or `nbgrader generate_assignment {lab}`) first") from None
        out = Assignment(lab, roster={s.id for s in gb.students})
        for nb in found.notebooks:
            out.notebooks[nb.name] = ({g.name for g in nb.grade_cells} | {s.name for s in nb.solution_cells}
                                      | {s.name for s in nb.source_cells})
    return out


def digest(folder: Path) -> str:
    """sha256 of every plain file in ``folder``: its path and bytes (links are not followed)."""
    h = hashlib.sha256()
    for path in sorted(path for path, st in entries(folder) if stat.S_ISREG(st.st_mode)):
        h.update(str(path.relative_to(folder)).encode() + b"\0" + read_plain(path) + b"\0")
    return h.hexdigest()


def notebook_problem(path: Path, grade_ids: set[str]) -> str | None:
    """Why ``path`` cannot be graded as this notebook, or None."""
    import nbformat

    name = f"{path.parent.name}/{path.name}"
    if not path.is_file():
        present = sorted(p.name for p in path.parent.iterdir()) if path.parent.is_dir() else []
        return (f"no {path.name} in the submission (found: {', '.join(present) or 'nothing'}); "
                "the notebook must keep the assignment's file name")
    try:
        data = json.loads(read_plain(path))
    except (ValueError, UnicodeDecodeError) as exc:
        return f"{name} is not valid JSON ({exc}); ask the student to submit the notebook again"
    try:
        nb = nbformat.from_dict(data)
        nbformat.validate(nb)
    except Exception as exc:  # noqa: BLE001 - nbformat raises several kinds
        first = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else type(exc).__name__
        return f"{name} is JSON but not a Jupyter notebook ({first})"
    seen: set[str] = set()
    for cell in nb.cells:
        grade_id = cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")
        if grade_id is None:
            continue
        if grade_id in seen:
            return f"{name}: the cell id {grade_id!r} appears twice (a graded cell was copied); " \
                   "delete the copy or submit the released notebook again"
        if grade_id not in grade_ids:
            return f"{name}: the cell id {grade_id!r} is not one of the assignment's (cell ids were " \
                   "changed); restore the cell from the released notebook"
        seen.add(grade_id)
    return None


def find(c: Course, a: Assignment) -> tuple[list[Submission], list[Rejected]]:
    """Every ``submitted/<student>/<lab>`` folder, to grade or rejected, sorted by student."""
    good, bad = [], []
    students = sorted(p.name for p in c.submitted.iterdir() if (p / a.lab).is_dir()) \
        if c.submitted.is_dir() else []
    for student in students:
        folder = c.submitted / student / a.lab
        if a.roster and student not in a.roster:
            bad.append(Rejected(student, a.lab, f"unknown student {student!r}: not in the gradebook's "
                                f"roster; if they are in the class, `nbgrader db student add {student}`"))
            continue
        unsafe = unsafe_entry(folder, c.submitted)  # first: nothing of such a folder is read or copied
        if unsafe:
            bad.append(Rejected(student, a.lab, unsafe))
            continue
        problems = [p for name, ids in sorted(a.notebooks.items())
                    if (p := notebook_problem(folder / f"{name}.ipynb", ids))]
        if problems:
            bad.append(Rejected(student, a.lab, "; ".join(problems)))
        else:
            good.append(Submission(student, a.lab, folder, digest(folder)))
    return good, bad


def absent(a: Assignment, submissions: list[Submission], rejected: list[Rejected]) -> list[str]:
    """Students on the roster with nothing submitted for the lab."""
    handed_in = {s.student for s in submissions} | {r.student for r in rejected}
    return sorted(a.roster - handed_in)
