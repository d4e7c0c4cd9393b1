"""Non-root grading where bwrap cannot make a user namespace (Ubuntu 24.04's AppArmor): said, with what to do.

A stand-in ``bwrap`` on PATH fails the way bwrap does under AppArmor's restriction
("setting up uid map: Permission denied"); ``bwrap_path`` (what ``parlab grade`` asks before
anything runs, and each box) must then name the cause and the remedy, never pass on.  As root
the probe is not run: root's boxes need no unprivileged user namespace.
"""
from __future__ import annotations

import os

import pytest

from parlab.grading import boundary

pytestmark = pytest.mark.unit


@pytest.fixture
def blocked_bwrap(tmp_path, monkeypatch):
    fake = tmp_path / "bwrap"
    fake.write_text("#!/bin/sh\necho 'bwrap: setting up uid map: Permission denied' >&2\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    return str(fake)


def test_a_blocked_user_namespace_is_named_with_the_remedy(blocked_bwrap, monkeypatch):
    assert "setting up uid map: Permission denied" in boundary.userns_blocked(blocked_bwrap)
    monkeypatch.setattr(boundary.os, "geteuid", lambda: 1000)
    with pytest.raises(boundary.BoundaryError) as e:
        boundary.bwrap_path()
    assert "setting up uid map: Permission denied" in str(e.value)
    assert "grade as root" in str(e.value) and "bwrap-userns-restrict" in str(e.value)
    monkeypatch.setattr(boundary.os, "geteuid", lambda: 0)
    assert boundary.bwrap_path() == blocked_bwrap


def test_a_working_bwrap_passes(tmp_path, monkeypatch):
    fake = tmp_path / "bwrap"
    fake.write_text("#!/bin/sh\nexit 0\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setattr(boundary.os, "geteuid", lambda: 1000)
    assert boundary.bwrap_path() == str(fake)
