"""The hub kit's collect plugin (hub/safe_collect.py) on hand-made inbound folders, in this process.

Each test puts into an exchange's inbound a clean submission of this
process's user and hostile entries next to it, runs the plugin's collect
(nbgrader's ``ExchangeCollect.start``), and checks that each hostile entry
is refused with a warning that names it and why, while the clean one is
still collected (with the server's time in its timestamp.txt).  The same checks with real
students and nbgrader's commands are tests/hub/test_hub_exchange.py.
"""
from __future__ import annotations

import logging
import os
import pwd
import socket
import sys
from datetime import timezone
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "hub"))
ME = pwd.getpwuid(os.getuid()).pw_name
LAB = "lab"
STATED = "2020-01-01 00:00:00.000000 UTC"


class NoDueDates:
    """The gradebook collect opens for the lab's due date: none here (nbgrader's Gradebook would run
    alembic in a process to make its database; due dates are tests/hub/test_hub_exchange.py's)."""

    def __init__(self, *args):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def find_assignment(self, name):
        from nbgrader.api import MissingEntry
        raise MissingEntry()


@pytest.fixture
def exchange(tmp_path, monkeypatch):
    import nbgrader.exchange.default.collect

    monkeypatch.setattr(nbgrader.exchange.default.collect, "Gradebook", NoDueDates)
    inbound = tmp_path / "exchange" / "parlab" / "inbound"
    inbound.mkdir(parents=True)
    return inbound


def submission(inbound: Path, name: str) -> Path:
    folder = inbound / name
    folder.mkdir()
    (folder / f"{LAB}.ipynb").write_text("{}")
    (folder / "timestamp.txt").write_text(STATED)
    return folder


def collect(inbound: Path, caplog, **traits) -> tuple[Path, str]:
    """Run the plugin's collect of LAB; returns the course root and the warnings it logged."""
    from nbgrader.auth import Authenticator
    from nbgrader.coursedir import CourseDirectory
    from safe_collect import SafeExchangeCollect

    root = inbound.parents[2] / "course"
    root.mkdir(exist_ok=True)
    coursedir = CourseDirectory(root=str(root), assignment_id=LAB, course_id="parlab")
    log = logging.getLogger("test-safe-collect")
    plugin = SafeExchangeCollect(coursedir=coursedir, authenticator=Authenticator(),
                                 root=str(inbound.parents[1]), log=log, **traits)
    with caplog.at_level(logging.WARNING, logger=log.name):
        plugin.start()
    return root, "\n".join(r.getMessage() for r in caplog.records)


def hostile(kind: str, folder: Path, monkeypatch) -> str:
    """Put ``kind`` into the submission ``folder``; returns what the refusal must say."""
    if kind == "fifo":
        os.mkfifo(folder / "pipe")
        return "'pipe' is a FIFO"
    if kind == "socket":
        monkeypatch.chdir(folder)  # a socket's path may not be longer than 107 bytes
        with socket.socket(socket.AF_UNIX) as s:
            s.bind("sock")
        return "'sock' is a socket"
    if kind == "nested link":
        (folder / "sub").mkdir()
        os.symlink("/etc/passwd", folder / "sub" / "passwd")
        return "'sub/passwd' is a symbolic link"
    if kind == "hard link":
        os.link(folder / f"{LAB}.ipynb", folder / "again.ipynb")
        return "'again.ipynb' has 2 hard links"
    if kind == "too many":
        for i in range(6):
            (folder / f"f{i}").write_text("")
        return "it holds more than 5 entries"
    if kind == "too deep":
        (folder / "a" / "b" / "c").mkdir(parents=True)
        return "'a/b/c' is nested more than 2 folders deep"
    if kind == "timestamp folder":
        (folder / "timestamp.txt").unlink()
        (folder / "timestamp.txt").mkdir()
        return "'timestamp.txt' is a folder"
    if kind == "foreign file":
        if os.getuid() != 0:
            pytest.skip("giving a file to another user needs root")
        (folder / "foreign").write_text("")
        os.chown(folder / "foreign", 65534, 65534)
        return f"'foreign' is owned by {pwd.getpwuid(65534).pw_name}, not by {ME}"
    raise ValueError(kind)


@pytest.mark.parametrize("kind", ["fifo", "socket", "nested link", "hard link", "foreign file", "too many",
                                  "too deep", "timestamp folder"])
def test_a_submission_holding_something_hostile_is_refused_and_an_earlier_one_collected(
        exchange, caplog, monkeypatch, kind):
    submission(exchange, f"{ME}+{LAB}+2020-01-01 00:00:00.000000 UTC+aaaa")
    bad = submission(exchange, f"{ME}+{LAB}+2030-01-01 00:00:00.000000 UTC+bbbb")  # newer, by name and ctime
    (bad / f"{LAB}.ipynb").write_text('{"hostile": true}')
    reason = hostile(kind, bad, monkeypatch)
    root, warned = collect(exchange, caplog, max_entries=5, max_depth=2)
    assert f"Not collecting {str(bad)!r}: {reason}" in warned, warned
    collected = root / "submitted" / ME / LAB
    assert sorted(os.listdir(collected)) == [f"{LAB}.ipynb", "timestamp.txt"]
    assert (collected / f"{LAB}.ipynb").read_text() == "{}"  # the earlier one


def test_odd_inbound_entries_are_refused_without_stopping_the_collect(exchange, caplog):
    from nbgrader.utils import parse_utc

    mine = submission(exchange, f"{ME}+{LAB}+not a time+aaaa")  # nbgrader's own collect stops on this name
    (exchange / f"{ME}+{LAB}+2030-01-01 00:00:00.000000 UTC+file").write_text("")  # a file, not a folder
    os.symlink(mine, exchange / f"{ME}+{LAB}+2030-01-01 00:00:00.000000 UTC+link")
    submission(exchange, f"no-such-user-\n+{LAB}+2030-01-01 00:00:00.000000 UTC+cccc")
    root, warned = collect(exchange, caplog)
    assert "UTC+file': it is a file, not a folder" in warned, warned
    assert "UTC+link': it is a symbolic link, not a folder" in warned, warned
    assert "its name claims student 'no-such-user-\\n', and no Unix user has that name" in warned, warned
    # The one real submission is collected, with the server's time (its files' ctime), not the stated one.
    stamped = parse_utc((root / "submitted" / ME / LAB / "timestamp.txt").read_text())
    newest = max(os.lstat(p).st_ctime for p in [mine, *mine.iterdir()])
    assert abs(stamped.replace(tzinfo=timezone.utc).timestamp() - newest) < 1e-3, (stamped, newest)
    assert f"timestamp.txt says {STATED!r}" in warned, warned
