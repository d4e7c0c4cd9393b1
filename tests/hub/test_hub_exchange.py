"""The exchange's inbound folder against hostile students: what the kit's collect plugin refuses.

Real Unix users (an instructor, plx-teach, and three students), the kit's
nbgrader configs (``hub/instructor``, ``hub/student``, found through
``JUPYTER_CONFIG_PATH`` as the hub's servers find them), and nbgrader's own
commands, each run as its Unix user; no hub is started (the exchange needs
none: tests/hub/test_hub_course.py is the course on a running hub).  The
instructor's course folder holds only a one-cell lab, with nbgrader's
defaults for everything the kit's config does not set.  The lab's due date
is an hour before the students submit, so every submission is late (one
started day: a tenth of the score, hub/late_penalty.py).

- plx-ada submits the right answer; then plx-bo puts a wrong one into
  inbound under her name, as ``nbgrader submit --student plx-ada`` would (a
  folder ``plx-ada+tiny+<later time>+<random>`` that he owns).
- plx-bo submits his own, then puts a link into it to the instructor's
  source notebook (solutions and a marker only it holds), which he cannot read.
- plx-cy submits the right answer, then writes a time two hours earlier
  (before the due date) into her submission's ``timestamp.txt``.

Then the instructor runs ``nbgrader collect`` and ``nbgrader autograde``.
``hub/safe_collect.py`` (named by ``hub/instructor/nbgrader_config.py``) must
refuse the planted folder and collect plx-ada's own submission, refuse plx-bo's
submission with the link and copy nothing it points at, and stamp plx-cy's
submission with the server's time, so that she is late and penalised.
Without the plugin (nbgrader's own collect) each of the three tests fails.
"""
from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import tempfile
import time
import uuid
from datetime import datetime, timedelta, timezone
from pathlib import Path
from shlex import quote

import nbformat
import pytest

from hub_tier import REPO

pytestmark = [pytest.mark.hub, pytest.mark.timeout(300)]

#: Fixed, so that a run killed half-way is cleaned up by the next one (its users-made list).
STATE = Path(tempfile.gettempdir()) / "parlab-hub-exchange-tier"
TEACHER, ADA, BO, CY = "plx-teach", "plx-ada", "plx-bo", "plx-cy"
LAB = "tiny"
#: The kit's config folders (``instructor/``, ``student/``), as the hub's servers get them.
CONFIG = REPO / "hub"
#: In the instructor's source notebook only (its solution): whatever holds it was copied from there.
SECRET = f"instructor-only-{uuid.uuid4().hex}"
ANSWERS = {ADA: "x = 1  # plx-ada's own answer", BO: "x = 2  # planted by plx-bo",
           CY: "x = 1  # plx-cy's answer"}


def _source_notebook() -> nbformat.NotebookNode:
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    cells = [(f"### BEGIN SOLUTION\nx = 1  # {SECRET}\n### END SOLUTION", dict(solution=True, grade=False)),
             ("assert x == 1", dict(solution=False, grade=True, points=1))]
    for i, (source, meta) in enumerate(cells):
        cell = nbformat.v4.new_code_cell(source)
        cell.metadata["nbgrader"] = dict(meta, grade_id=f"cell-{i}", locked=not meta["solution"],
                                         schema_version=3)
        nb.cells.append(cell)
    return nb


def _start(hub, user: str, script: str, cwd: Path | None = None) -> subprocess.Popen:
    """``bash -c script`` as ``user``, with the environment and nbgrader config of their server."""
    from unix_users import as_user

    env = hub.server_env(user)
    env["JUPYTER_CONFIG_PATH"] = str(CONFIG / ("instructor" if user == TEACHER else "student"))
    return subprocess.Popen(as_user(user, ["bash", "-c", script], env), env=env,
                            cwd=cwd or pwd.getpwnam(user).pw_dir, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _wait(*procs: subprocess.Popen) -> list[str]:
    outs = []
    for proc in procs:
        out, _ = proc.communicate(timeout=240)
        assert proc.returncode == 0, f"{proc.args[-1]} exited {proc.returncode}:\n{out[-3000:]}"
        outs.append(out)
    return outs


def _submitted_to(out: str) -> str:
    """The inbound folder ``nbgrader submit`` says it wrote."""
    return next(line.split("Destination: ", 1)[1].strip() for line in out.splitlines()
                if "Destination: " in line)


def _give(hub, user: str, answer: str) -> None:
    """The released lab in the student's ~/tiny (as Fetch puts it), answered."""
    released = hub.exchange / "parlab" / "outbound" / LAB / f"{LAB}.ipynb"
    nb = nbformat.read(released, as_version=4)
    nb.cells[0].source = answer
    entry = pwd.getpwnam(user)
    folder = Path(entry.pw_dir) / LAB
    folder.mkdir()
    nbformat.write(nb, folder / f"{LAB}.ipynb")
    for path in (folder, folder / f"{LAB}.ipynb"):
        os.chown(path, entry.pw_uid, entry.pw_gid)


@pytest.fixture(scope="module")
def collected():
    from course_hub import CourseHub

    CourseHub(STATE, [TEACHER], [ADA, BO, CY]).remove_users()  # a killed earlier run's users
    shutil.rmtree(STATE, ignore_errors=True)
    hub = CourseHub(STATE, [TEACHER], [ADA, BO, CY])
    try:
        hub.create_users()
        hub.exchange.mkdir(parents=True)
        os.chmod(STATE, 0o755)
        os.chmod(hub.exchange, 0o1777)
        course = hub.course_dir()
        source = course / "source" / LAB / f"{LAB}.ipynb"
        source.parent.mkdir(parents=True)
        nbformat.write(_source_notebook(), source)
        subprocess.run(["chown", "-R", f"{TEACHER}:", str(course)], check=True)
        due = datetime.now(timezone.utc) - timedelta(hours=1)
        _wait(_start(hub, TEACHER, f"nbgrader generate_assignment {LAB} && nbgrader release_assignment {LAB}",
                     course))
        from nbgrader.api import Gradebook

        with Gradebook(f"sqlite:///{course / 'gradebook.db'}", "parlab") as gb:  # nbgrader db assignment add
            gb.update_or_create_assignment(LAB, duedate=f"{due:%Y-%m-%d %H:%M:%S} UTC")
        for user, answer in ANSWERS.items():
            _give(hub, user, answer)
        submit = f"nbgrader submit {LAB}"
        ada, bo, cy = (_submitted_to(out) for out in _wait(*(_start(hub, u, submit) for u in (ADA, BO, CY))))
        # plx-bo plants a newer submission under plx-ada's name (what `nbgrader submit --student plx-ada`
        # does, by hand) and links the instructor's source notebook into his own; plx-cy backdates hers.
        now = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M:%S.%f UTC")
        planted = str(Path(ada).parent / f"{ADA}+{LAB}+{now}+{uuid.uuid4().hex[:12]}")
        backdated = (due - timedelta(hours=1)).strftime("%Y-%m-%d %H:%M:%S.%f UTC")
        changed_from = time.time()
        plant = (f"mkdir {quote(planted)} && cp {LAB}/{LAB}.ipynb {quote(planted)}/"
                 f" && printf '%s' {quote(now)} > {quote(planted + '/timestamp.txt')}")
        _wait(_start(hub, BO, f"{plant} && ln -s {source} {quote(bo + '/stolen.ipynb')}"),
              _start(hub, CY, f"printf '%s' {quote(backdated)} > {quote(cy + '/timestamp.txt')}"))
        changed_by = time.time()
        out = _wait(_start(hub, TEACHER, f"nbgrader collect {LAB} && nbgrader autograde {LAB}", course))[0]
        yield dict(course=course, out=out, inbound={ADA: ada, BO: bo, CY: cy, "planted": planted},
                   backdated=backdated, changed=(changed_from, changed_by))
    finally:
        hub.remove_users()
        shutil.rmtree(STATE, ignore_errors=True)


def _lateness(course: Path) -> dict[str, tuple[float, float, float]]:
    """{student: (seconds late, score, late penalty)} of the lab in the course's gradebook."""
    from nbgrader.api import Gradebook

    with Gradebook(f"sqlite:///{course / 'gradebook.db'}", "parlab") as gb:
        return {s.student.id: (s.total_seconds_late, s.score, s.late_submission_penalty)
                for s in gb.find_assignment(LAB).submissions}


def test_a_folder_planted_under_another_students_name_is_refused(collected):
    out, planted = collected["out"], collected["inbound"]["planted"]
    notebook = (collected["course"] / "submitted" / ADA / LAB / f"{LAB}.ipynb").read_text()
    assert ANSWERS[ADA] in notebook and ANSWERS[BO] not in notebook
    assert _lateness(collected["course"])[ADA][1] == 1.0  # her own answer, graded
    assert f"Not collecting {planted!r}: '.' is owned by {BO}, not by {ADA}" in out, out


def test_a_link_in_ones_own_submission_is_refused_and_nothing_it_names_is_copied(collected):
    course, out = collected["course"], collected["out"]
    assert os.path.islink(os.path.join(collected["inbound"][BO], "stolen.ipynb"))
    copied = [str(p) for folder in ("submitted", "autograded") for p in (course / folder).rglob("*")
              if p.is_file() and SECRET in p.read_text(errors="replace")]
    assert copied == [], copied
    assert not (course / "submitted" / BO).exists()
    assert f"Not collecting {collected['inbound'][BO]!r}: 'stolen.ipynb' is a symbolic link" in out, out


def test_a_backdated_timestamp_is_replaced_by_the_servers_time(collected):
    from nbgrader.utils import parse_utc

    stamped = (collected["course"] / "submitted" / CY / LAB / "timestamp.txt").read_text()
    when = parse_utc(stamped).replace(tzinfo=timezone.utc).timestamp()
    changed_from, changed_by = collected["changed"]
    assert changed_from - 1 <= when <= changed_by + 1, (stamped, collected["changed"])  # her last change
    assert f"timestamp.txt says {collected['backdated']!r}" in collected["out"], collected["out"]
    # The late policy reads the collected time: late by about the hour, one started day, 10 % of 1 point.
    late, score, penalty = _lateness(collected["course"])[CY]
    assert 3000 < late < 4000 and score == 1.0 and penalty == pytest.approx(0.1), (late, score, penalty)
