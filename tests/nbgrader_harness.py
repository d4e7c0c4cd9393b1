"""Autograde lab notebooks with the real nbgrader, in a throw-away course folder.

    from nbgrader_harness import RELEASED, autograde, source_notebook
    result = autograde("00-setup", {"solution": source_notebook("00-setup"), "blank": RELEASED})
    result["solution"]["score"], result["solution"]["max_score"], result["solution"]["cells"]

What it does, in a temporary course root that holds a copy of the
repository's nbgrader_config.py (so every course setting applies: folder
names, cell timeout, output limits):

1. copies solutions/<lab>/ in and generates the student version, as
   ``nbgrader generate_assignment <lab> --force`` does (``scripts/release.py``);
2. puts each student's notebook at submitted/<student>/<lab>/<notebook>.ipynb;
3. autogrades every student, as ``nbgrader autograde <lab> --force`` does;
4. reads each student's scores from the gradebook (nbgrader.api.Gradebook).

``autograde_labs`` does steps 1 and 3 for many labs: one process generates
them all, and ``streams`` processes autograde them side by side, each in its
own copy of the course (nbgrader's gradebook is one SQLite file per course).

Every process that nbgrader starts (kernels, torchrun, ranks) inherits a
unique PARLAB_HARNESS_TOKEN environment variable; ``leftover_processes``
finds any still alive by that token, orphans included.
"""
from __future__ import annotations

import ast
import collections
import concurrent.futures
import importlib.util
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from datetime import datetime
from pathlib import Path

import nbformat

REPO = Path(__file__).resolve().parents[1]
TOKEN_VAR = "PARLAB_HARNESS_TOKEN"
#: Pass this instead of a path to submit the student version generated in the same run.
RELEASED = "released"
#: Or this, for that student version cut down to its graded cells (see ``graded_cells_only``).
RELEASED_GRADED_CELLS = "released, graded cells only"


def _release_module():
    spec = importlib.util.spec_from_file_location("parlab_release", REPO / "scripts" / "release.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


release_script = _release_module()


def lab_names() -> list[str]:
    """Every lab folder under solutions/ (the same discovery scripts/release.py uses)."""
    return release_script.lab_names(REPO)


def source_notebook(lab: str) -> Path:
    """The instructor notebook of a lab (one notebook per lab folder)."""
    (path,) = sorted((REPO / "solutions" / lab).glob("*.ipynb"))
    return path


def release_notebook(lab: str) -> Path:
    """The committed student notebook of a lab."""
    return REPO / "labs" / lab / source_notebook(lab).name


def graded_cells_only(nb) -> None:
    """Keep the first code cell (the imports), every nbgrader answer and test cell, and the
    import statements of the other code cells (an answer may name a type they import).

    nbgrader scores only the test cells, so this is enough to learn what a
    notebook would score; it skips the lab's demonstrations and measurements.
    """
    first = next(i for i, c in enumerate(nb.cells) if c.cell_type == "code")
    kept = []
    for i, cell in enumerate(nb.cells):
        meta = cell.metadata.get("nbgrader", {})
        if i == first or meta.get("grade") or meta.get("solution"):
            kept.append(cell)
        elif cell.cell_type == "code" and (imports := _import_lines(cell.source)):
            kept.append(nbformat.v4.new_code_cell(imports))
    nb.cells = kept


def _import_lines(source: str) -> str:
    """The top-level import statements of a code cell ("" if none, or if it is not plain Python)."""
    try:
        tree = ast.parse(source)
    except SyntaxError:  # IPython magics
        return ""
    return "\n".join(ast.get_source_segment(source, node) for node in tree.body
                     if isinstance(node, (ast.Import, ast.ImportFrom)))


def notebook_seconds(path: Path) -> float:
    """Wall time of an executed notebook, from the timings nbclient records in each cell."""
    stamps = []
    for cell in nbformat.read(path, as_version=4).cells:
        execution = cell.get("metadata", {}).get("execution", {})
        stamps += [datetime.fromisoformat(v.replace("Z", "+00:00")) for v in execution.values()]
    return (max(stamps) - min(stamps)).total_seconds() if stamps else 0.0


def leftover_processes(token: str) -> list[tuple[int, str]]:
    """(pid, command line) of live processes whose environment carries ``token``."""
    found = []
    needle = f"{TOKEN_VAR}={token}".encode()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if needle not in f.read().split(b"\0"):
                    continue
            with open(f"/proc/{entry}/stat", "rb") as f:
                if f.read().rsplit(b")", 1)[1].split()[0] == b"Z":  # exited, awaiting its parent
                    continue
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                found.append((int(entry), f.read().replace(b"\0", b" ").decode(errors="replace").strip()))
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
    return found


def autograde(lab: str, submissions: dict[str, Path | str], workdir: Path | None = None,
              timeout: float = 900) -> dict[str, dict]:
    """Generate ``lab``, submit each student's notebook, autograde them all, and return scores.

    ``submissions`` maps a student id to a notebook path, to ``RELEASED``
    for the untouched student version that this run generated, or to
    ``RELEASED_GRADED_CELLS`` for its graded cells alone.

    Returns ``{student: {"score", "max_score", "cells": {grade_id: (score, max_score)},
    "seconds": notebook execution time, "autograded": path}}`` plus one entry
    ``"_run"`` with the course ``root``, the ``token`` its processes carry,
    and ``generate_seconds`` / ``autograde_seconds`` (wall time of each step).
    """
    return autograde_labs([lab], submissions, workdir, timeout)[lab]


def autograde_labs(labs: list[str], submissions: dict[str, Path | str], workdir: Path | None = None,
                   timeout: float = 900, streams: int = 1) -> dict[str, dict]:
    """``autograde`` for several labs at once: {lab: result}.

    One process generates every lab (each nbgrader command costs several
    seconds of start-up).  A submission path is used for each lab it names:
    pass a dict {lab: path} as the value to submit a different notebook per
    lab, or ``RELEASED``.  ``timeout`` bounds each lab's share of the
    autograde step.

    With ``streams`` > 1 that many autograde processes run at once, each in a
    copy of the generated course (its own gradebook), taking the next lab
    from one queue, costliest first (``grading_work``): on a few cores a
    launch leaves much of the machine idle (one process starts, imports
    torch, then waits for its ranks), so two streams share it.  Grading is
    the same nbgrader autograde of the same files either way.
    """
    from nbgrader.api import Gradebook

    root = Path(workdir) if workdir else Path(tempfile.mkdtemp(prefix="parlab-grade-"))
    root.mkdir(parents=True, exist_ok=True)
    shutil.copy(REPO / "nbgrader_config.py", root / "nbgrader_config.py")
    for lab in labs:
        shutil.copytree(REPO / "solutions" / lab, root / "solutions" / lab,
                        ignore=shutil.ignore_patterns(".ipynb_checkpoints", "__pycache__"))
    token = secrets.token_hex(8)
    env = dict(os.environ, **{TOKEN_VAR: token})
    # nbgrader calls the `alembic` command when it creates gradebook.db: use this venv's.
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")

    gen = _run_here("release", root, labs, env, timeout)
    release_dir = root / release_script.load_config(root).CourseDirectory.release_directory
    for lab in labs:
        notebook = source_notebook(lab).name
        for student, path in submissions.items():
            path = path.get(lab, RELEASED) if isinstance(path, dict) else path
            dest = root / "submitted" / student / lab
            dest.mkdir(parents=True)
            if path == RELEASED_GRADED_CELLS:
                nb = nbformat.read(release_dir / lab / notebook, as_version=4)
                graded_cells_only(nb)
                nbformat.write(nb, dest / notebook)
            else:
                shutil.copy(release_dir / lab / notebook if path == RELEASED else path, dest / notebook)
    start = time.perf_counter()
    graded_in = _autograde_in_streams(root, labs, env, timeout, streams)
    grade = time.perf_counter() - start

    course_id = release_script.load_config(root).CourseDirectory.course_id
    out: dict[str, dict] = {}
    for lab in labs:
        course = graded_in[lab]
        results: dict[str, dict] = {"_run": {"root": course, "token": token, "generate_seconds": gen,
                                             "autograde_seconds": grade, "labs": len(labs),
                                             "streams": len(set(graded_in.values()))}}
        with Gradebook(f"sqlite:///{course / 'gradebook.db'}", course_id) as gb:
            for student in submissions:
                sub = gb.find_submission(lab, student)
                cells = {g.name: (g.score, g.max_score) for nb in sub.notebooks for g in nb.grades}
                done = course / "autograded" / student / lab / source_notebook(lab).name
                results[student] = {"score": sub.score, "max_score": sub.max_score, "cells": cells,
                                    "seconds": notebook_seconds(done), "autograded": done}
        out[lab] = results
    return out


def grading_work(lab: str) -> int:
    """How much grading a lab asks for, to order the queue: the check calls in its test cells."""
    nb = nbformat.read(source_notebook(lab), as_version=4)
    return sum(cell.source.count(f"lab{lab[:2]}.check_") for cell in nb.cells
               if cell.metadata.get("nbgrader", {}).get("grade"))


def _autograde_in_streams(root: Path, labs: list[str], env: dict, timeout: float, streams: int) -> dict:
    """Autograde ``labs`` in ``streams`` processes at a time; {lab: the course root it was graded in}."""
    streams = max(1, min(streams, len(labs)))
    if streams == 1:
        _run_here("autograde", root, labs, env, timeout * len(labs))
        return {lab: root for lab in labs}
    # Beside the course, not inside it: a course inside another course's folder is graded as the outer
    # one (the grading boundary takes the outermost folder holding an nbgrader_config.py).
    courses = [root.parent / f"{root.name}-stream{i}" for i in range(streams)]
    for course in courses:
        shutil.rmtree(course, ignore_errors=True)
        shutil.copytree(root, course)
    queue = collections.deque(sorted(labs, key=grading_work, reverse=True))
    lock, graded_in, failures = threading.Lock(), {}, []

    def stream(course: Path) -> None:
        while True:
            with lock:
                if not queue:
                    return
                lab = queue.popleft()
            try:
                _run_here("autograde", course, [lab], env, timeout)
                graded_in[lab] = course
            except (RuntimeError, subprocess.TimeoutExpired) as err:  # the other labs still get graded
                failures.append(str(err))

    with concurrent.futures.ThreadPoolExecutor(streams) as pool:
        try:
            for done in [pool.submit(stream, course) for course in courses]:
                done.result()
        except BaseException:  # Ctrl-C or a pytest timeout: no new lab, and the running ones stopped
            with lock:
                queue.clear()
            for proc in list(_RUNNING):
                proc.terminate()
            raise
    if failures:
        raise RuntimeError("\n\n".join(failures))
    return graded_in


#: The nbgrader processes of ``_run_here`` running now, so that an interrupted run can end them.
_RUNNING: set = set()


def _run_here(step: str, root: Path, labs: list[str], env: dict, timeout: float) -> float:
    """Run this file's ``step`` for ``labs`` in a fresh Python (nbgrader's apps keep global state)."""
    start = time.perf_counter()
    with subprocess.Popen([sys.executable, __file__, step, str(root), *labs], cwd=root, env=env,
                          stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True) as popen:
        _RUNNING.add(popen)
        try:
            out, _ = popen.communicate(timeout=timeout)
        except BaseException:
            popen.kill()
            popen.communicate()
            raise
        finally:
            _RUNNING.discard(popen)
    proc = subprocess.CompletedProcess(popen.args, popen.returncode, out)
    if proc.returncode != 0:
        raise RuntimeError(f"nbgrader {step} {' '.join(labs)} failed (exit {proc.returncode}):\n"
                           f"{proc.stdout[-6000:]}")
    return time.perf_counter() - start


def _autograde_all(root: Path, labs: list[str]) -> None:
    """What ``nbgrader autograde <lab> --force`` runs, for each lab, in this one process."""
    from nbgrader.converters import Autograde
    from nbgrader.coursedir import CourseDirectory

    release_script.use_this_python_for_tools()
    config = release_script.load_config(root)
    for lab in labs:
        coursedir = CourseDirectory(config=config)
        coursedir.assignment_id = lab
        app = Autograde(coursedir=coursedir, config=config)
        app.force = True
        app.start()  # raises NbGraderException (with nbgrader's log) when a notebook fails


if __name__ == "__main__":  # python nbgrader_harness.py release|autograde ROOT LAB...
    step, course, *names = sys.argv[1:]
    if step == "release":
        release_script.release(Path(course), names)
    else:
        _autograde_all(Path(course), names)
