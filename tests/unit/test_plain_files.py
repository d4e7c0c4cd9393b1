"""What the grader reads from places a student or the student's code could have written: plain files only.

- ``parlab grade`` refuses a submitted folder holding a symbolic link, a
  FIFO, a socket or a file with several hard links, naming it, before it
  copies anything (copying a FIFO raised, and stopped the whole run), and
  the course copy it grades keeps links as links; ``nbgrader autograde``'s
  execute step refuses the same folder before a kernel starts.
- The sandbox never waits on a FIFO in place of a handed-in answer, nor
  reads one through a link: the answer scores 0, with a message.
- The launcher reads its ranks' files (output, pid, error, result) only
  as plain files, and never truncates a link's target.
- ``parlab grade``'s default ``--timeout``.

Each FIFO read runs in a thread that is given 5 s: before these checks it
waited for a writer forever.
"""
from __future__ import annotations

import hashlib
import os
import socket
import threading
from pathlib import Path

import nbformat
import pytest

from nbgrader_harness import REPO
from parlab import plainfile
from parlab.classgrade import inputs, plan, worker
from parlab.grading.autograde import sandbox
from parlab.launch import output
from parlab.launch.jobdir import JobDir

pytestmark = pytest.mark.unit

SECRET = "only-root-reads-this"


def _within(seconds: float, fn, *args):
    """``fn(*args)``'s result or exception, failing the test if it is still waiting after ``seconds``."""
    got = {}

    def run():
        try:
            got["value"] = fn(*args)
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            got["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        for path in args:  # let the reader go: a writer comes
            if isinstance(path, (str, Path)) and os.path.exists(path):
                os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
        pytest.fail(f"{getattr(fn, '__name__', fn)} still waiting after {seconds} s")
    if "error" in got:
        raise got["error"]
    return got["value"]


@pytest.fixture
def secret(tmp_path):
    path = tmp_path / "root-only.txt"
    path.write_text(SECRET)
    path.chmod(0o600)
    return path


# ---------------------------------------------------------------- the reader
def test_read_plain_refuses_a_fifo_a_link_and_a_folder_without_waiting(tmp_path, secret):
    fifo, link, plain = tmp_path / "fifo", tmp_path / "link", tmp_path / "plain"
    os.mkfifo(fifo)
    link.symlink_to(secret)
    plain.write_bytes(b"answer")
    for path, words in ((fifo, "a FIFO"), (link, "a symbolic link"), (tmp_path, "a folder")):
        with pytest.raises(plainfile.NotPlainFile, match=words):
            _within(5, plainfile.read_plain, path)
    assert plainfile.read_plain(plain) == b"answer" and plainfile.read_plain(plain, 3) == b"wer"
    with pytest.raises(FileNotFoundError):
        plainfile.read_plain(tmp_path / "missing")


def test_sandbox_scores_a_fifo_or_link_in_place_of_an_answer_zero_at_once(tmp_path, secret):
    fifo, link = tmp_path / "cell6-0.pkl", tmp_path / "cell9-0.pkl"
    os.mkfifo(fifo)
    link.symlink_to(secret)
    for path, words in ((fifo, "a FIFO"), (link, "a symbolic link")):
        call = {"lab": "lab00", "check": "check_hello", "name": "hello", "hidden": False, "payload": str(path)}
        with pytest.raises(plainfile.NotPlainFile):
            _within(5, sandbox._payload, call)
        verdict = _within(5, sandbox.grade_request, call)
        assert not verdict["passed"] and f"hello was not handed in for grading: its file is {words}" \
            in verdict["message"], verdict
        # the shared launches leave such a cell out (graded alone, as above) instead of failing them all
        assert _within(5, sandbox.shared_verdicts, [{"key": 6, "calls": [call]}]) == {}


# ---------------------------------------------------------------- the launcher's reads of its ranks' files
def test_launcher_reads_rank_files_only_as_plain_files(tmp_path, secret, monkeypatch):
    job = JobDir(str(tmp_path))
    os.mkfifo(job.file("pid", 0))
    os.mkfifo(job.file("error", 0))
    os.mkfifo(job.agent_log)
    Path(job.file("err", 0)).symlink_to(secret)
    Path(job.file("result", 0)).symlink_to(secret)
    assert _within(5, job.pids) == {}
    assert _within(5, job.errors, 1) == {}
    assert _within(5, job.agent_text) == ""
    assert job.read_text("err", 0) == ""
    with pytest.raises(plainfile.NotPlainFile):
        job.read_bytes("result", 0)
    # a rank's output file made a link to another file: not read, and (past the size at which the
    # tail empties the file) that file is never truncated
    monkeypatch.setattr(output, "TRUNCATE_BYTES", 4)
    out = Path(job.file("out", 0))
    out.symlink_to(secret)
    assert output.FileTail(str(out)).read_lines() == []
    assert secret.read_text() == SECRET
    out.unlink()
    os.mkfifo(out)
    assert _within(5, output.FileTail(str(out)).read_lines) == []
    out.unlink()
    out.write_text("one\ntwo\nthree")  # a plain file: read, then emptied past the size
    tail = output.FileTail(str(out))
    assert tail.read_lines() == ["one", "two"] and out.stat().st_size == 0


# ---------------------------------------------------------------- the submitted folder
def _course(tmp_path) -> tuple[inputs.Course, inputs.Assignment]:
    root = tmp_path / "course"
    (root / "solutions" / "00-setup").mkdir(parents=True)
    (root / "nbgrader_config.py").write_text("")
    c = inputs.Course(root=root, source=root / "solutions", submitted=root / "submitted",
                      autograded=root / "autograded", feedback=root / "feedback",
                      db_url=f"sqlite:///{root / 'gradebook.db'}", course_id="parlab")
    return c, inputs.Assignment("00-setup", {"00-setup": set()})


def _submit(c: inputs.Course, student: str) -> Path:
    folder = c.submitted / student / "00-setup"
    folder.mkdir(parents=True)
    nbformat.write(nbformat.v4.new_notebook(), folder / "00-setup.ipynb")
    return folder


def test_parlab_grade_refuses_links_fifos_sockets_and_hard_links_naming_the_file(tmp_path, secret):
    c, a = _course(tmp_path)
    _submit(c, "ada")
    (_submit(c, "bo") / "notes.txt").symlink_to(secret)
    (_submit(c, "cy") / "data").mkdir()
    (c.submitted / "cy" / "00-setup" / "data" / "sol").symlink_to(REPO / "solutions")  # a link to a folder
    dee = c.submitted / "dee" / "00-setup"
    dee.mkdir(parents=True)
    os.mkfifo(dee / "00-setup.ipynb")  # copying it into the course copy would stop parlab grade itself
    eve = _submit(c, "eve")
    os.link(eve / "00-setup.ipynb", tmp_path / "elsewhere.ipynb")
    fay = _submit(c, "fay")
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(fay / "s"))
    (c.submitted / "gus").symlink_to(c.submitted / "ada")  # the student's folder itself
    good, bad = _within(10, inputs.find, c, a)
    assert [s.student for s in good] == ["ada"]
    reasons = {r.student: r.reason for r in bad}
    assert reasons["bo"].startswith("bo/00-setup/notes.txt is a symbolic link: a submission may hold only plain")
    assert reasons["cy"].startswith("cy/00-setup/data/sol is a symbolic link")
    assert reasons["dee"].startswith("dee/00-setup/00-setup.ipynb is a FIFO (named pipe)")
    assert reasons["eve"].startswith("eve/00-setup/00-setup.ipynb has 2 hard links")
    assert reasons["fay"].startswith("fay/00-setup/s is a socket")
    assert reasons["gus"].startswith("gus is a symbolic link")
    assert all("submit again" in why for why in reasons.values())
    assert SECRET not in str(reasons)


def test_digest_reads_plain_files_only_and_is_unchanged_for_them(tmp_path):
    folder = tmp_path / "sub"
    (folder / "d").mkdir(parents=True)
    (folder / "a.ipynb").write_bytes(b"{}")
    (folder / "d" / ".hidden").write_bytes(b"x")
    h = hashlib.sha256()  # what the digest was before links were refused: recorded digests still match
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        h.update(str(path.relative_to(folder)).encode() + b"\0" + path.read_bytes() + b"\0")
    assert inputs.digest(folder) == h.hexdigest()


def test_course_copy_keeps_links_as_links_and_writes_through_none(tmp_path, secret):
    """The second line, should a link appear after ``find``: copied as a link, never read or rewritten."""
    c, _ = _course(tmp_path)
    folder = _submit(c, "ada")
    (folder / "00-setup.ipynb").unlink()
    target = tmp_path / "target.ipynb"
    nbformat.write(nbformat.v4.new_notebook(), target)
    before = target.read_bytes()
    (folder / "00-setup.ipynb").symlink_to(target)
    (folder / "notes.txt").symlink_to(secret)
    nbformat.write(nbformat.v4.new_notebook(), c.source / "00-setup" / "00-setup.ipynb")
    (tmp_path / "template.db").write_bytes(b"")
    copy = worker.prepare(c, inputs.Submission("ada", "00-setup", folder, "d"), tmp_path / "template.db")
    copied = copy / "submitted" / "ada" / "00-setup"
    assert (copied / "notes.txt").is_symlink() and (copied / "00-setup.ipynb").is_symlink()
    assert target.read_bytes() == before


def test_nbgrader_autograde_execute_step_refuses_the_same_folder(tmp_path, secret):
    from traitlets.config import Config

    from parlab.grading.autograde import GuardedExecute
    from parlab.grading.autograde.execute import UnsafeSubmission

    c, _ = _course(tmp_path)
    (_submit(c, "bo") / "notes.txt").symlink_to(secret)
    config = Config()
    config.CourseDirectory.root = str(c.root)
    resources = {"nbgrader": {"student": "bo", "assignment": "00-setup"}, "metadata": {"path": str(tmp_path)}}
    step = GuardedExecute(config=config)
    with pytest.raises(UnsafeSubmission, match="bo/00-setup/notes.txt is a symbolic link"):
        step.preprocess(nbformat.v4.new_notebook(), resources)
    (c.submitted / "bo" / "00-setup" / "notes.txt").unlink()
    step._refuse_unsafe_submission(resources)  # a plain folder passes


# ---------------------------------------------------------------- the default --timeout
def test_default_timeout_is_what_the_graders_own_limits_allow(tmp_path):
    c = inputs.course(REPO)
    code, tests = plan.cell_counts(c, "00-setup")
    assert (code, tests) == (17, 5)  # lab 00 today; Execute.timeout = 300 in the course config
    assert plan.default_timeout(c, "00-setup") == 300 * (17 + 2 * 5) + plan.TIMEOUT_MARGIN == 8700
    assert plan.submission_timeout(c, "00-setup", None) == 8700
    assert plan.submission_timeout(c, "00-setup", 0) is None  # --timeout 0: no limit
    assert plan.submission_timeout(c, "00-setup", 90) == 90
