"""Throw-away Unix users for the tests that act out a class on one host.

``users`` (a module fixture) makes two users, alice and bob, with useradd and
removes them afterwards, killing by pid whatever of theirs is still running
(and failing the test that left it).  Without root or useradd it skips with
the reason.  ``as_user`` turns a command into one run as such a user, with the
suite's interpreter reachable: where it lies under a folder other users may not
enter (/root on the course machines), the command runs in a private mount
namespace (bubblewrap, as root) whose copy of that folder shows only the
interpreter's tree, read-only.
"""
from __future__ import annotations

import os
import pwd
import shutil
import stat
import subprocess
import sys
import uuid

import psutil
import pytest

import parlab

HERE = os.path.dirname(os.path.abspath(__file__))  # tests/


def _reason_no_users():
    if os.getuid() != 0:
        return "making Unix users needs root"
    missing = [t for t in ("useradd", "userdel", "setpriv") if not shutil.which(t)]
    return f"{', '.join(missing)} not installed" if missing else None


def _hidden_folders() -> list[tuple[str, str]]:
    """(folder others may not enter, its child on the way) for the interpreter and the package."""
    found = []
    for path in {os.path.realpath(sys.executable), sys.prefix, sys.base_prefix,
                 os.path.dirname(parlab.__file__), HERE}:
        parts = os.path.realpath(path).split(os.sep)
        for i in range(2, len(parts)):
            folder = os.sep.join(parts[:i]) or os.sep
            if not os.stat(folder).st_mode & stat.S_IXOTH:
                found.append((folder, os.sep.join(parts[:i + 1])))
                break
    return sorted(set(found))


def as_user(user: str, argv: list[str], env: dict) -> list[str]:
    """``argv`` run as ``user``, with the interpreter reachable (see the module docstring)."""
    ent = pwd.getpwnam(user)
    switch = ["setpriv", f"--reuid={ent.pw_uid}", f"--regid={ent.pw_gid}", "--clear-groups", "--"]
    hidden = _hidden_folders()
    if not hidden:
        return switch + argv
    if not shutil.which("bwrap"):
        pytest.skip(f"{hidden[0][0]} is closed to other users and bubblewrap is not installed")
    mounts = ["--dev-bind", "/", "/"]
    for folder, child in hidden:
        mounts += ["--tmpfs", folder, "--ro-bind", child, child]
    return ["bwrap", *mounts, "--die-with-parent", "--"] + switch + argv


@pytest.fixture(scope="module")
def users():
    reason = _reason_no_users()
    if reason:
        pytest.skip(reason)
    tag = uuid.uuid4().hex[:6]
    names = [f"pl{who}{tag}" for who in ("alice", "bob")]
    made = []
    try:
        for name in names:
            subprocess.run(["useradd", "--no-create-home", "--user-group", "--shell", "/usr/sbin/nologin",
                            name], check=True, capture_output=True)
            made.append(name)
        yield {n[2:-6]: pwd.getpwnam(n) for n in names}
    finally:
        uids = {pwd.getpwnam(n).pw_uid for n in made}
        left = [p for p in psutil.process_iter(["uids", "cmdline"]) if p.info["uids"] and p.info["uids"].real in uids]
        for p in left:
            p.kill()  # only our throw-away users' processes, by pid
        for name in made:
            subprocess.run(["userdel", name], check=False, capture_output=True)
        assert not left, ("processes of the test users were still running: "
                          f"{[(p.pid, ' '.join(p.info['cmdline'] or [])[:200]) for p in left]}")
