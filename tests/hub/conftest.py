"""Fixtures of the hub tier: one course hub (hub/) with real Unix users, and one Chromium.

Both live for the whole tier (the story in test_hub_course.py runs in
order on them): starting a hub, three servers and a browser is most of the
tier's cost.  ``tests/conftest.py`` skips the tier, with the reason, without
root, JupyterHub, configurable-http-proxy, Chromium or Playwright.
"""
from __future__ import annotations

import importlib.util
import json
import os
import pwd
import shutil
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from hub_tier import INSTRUCTOR, REPO, STATE, STUDENTS  # noqa: E402

sys.path.insert(0, str(REPO / "hub"))
sys.path.insert(0, str(REPO / "tests" / "browser"))

# JupyterLab user settings of every test user, as the browser tier sets them
# (tests/browser/lab_server.py): every cell in the page, no pop-ups over it.
_spec = importlib.util.spec_from_file_location("browser_tier_conftest", REPO / "tests/browser/conftest.py")
browser_tier = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(browser_tier)
# Under its own name: in a whole-suite run the name `conftest` is another tier's (tests/slurm's).
sys.modules.setdefault("browser_tier_conftest", browser_tier)


def _write_lab_settings(user: str) -> None:
    from lab_server import LAB_SETTINGS

    entry = pwd.getpwnam(user)
    settings = Path(entry.pw_dir) / ".jupyter" / "lab" / "user-settings"
    for plugin, values in LAB_SETTINGS.items():
        path = settings / f"{plugin}.jupyterlab-settings"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(values))
    for folder, _, files in os.walk(Path(entry.pw_dir) / ".jupyter"):
        for name in [folder, *(os.path.join(folder, f) for f in files)]:
            os.chown(name, entry.pw_uid, entry.pw_gid)


@pytest.fixture(scope="session")
def course_hub():
    from course_hub import CourseHub

    CourseHub(STATE, [INSTRUCTOR], list(STUDENTS)).remove_users()  # a killed earlier run's users
    shutil.rmtree(STATE, ignore_errors=True)
    # Each server gets a 3 GB memory cgroup and, by the hub's default (the cores divided by the class of 3),
    # a CPU set of one core of this 2-core machine's two.
    hub = CourseHub(STATE, [INSTRUCTOR], list(STUDENTS), mem_limit="3G")
    try:
        hub.deploy()  # the servers run the student edition, installed: nothing of this repository
        hub.create_users()
        for user in hub.users:
            _write_lab_settings(user)
        hub.prepare_course()
        hub.start()
        yield hub
    finally:
        hub.stop()
        hub.remove_users()
        artifacts = REPO / "test-artifacts" / "hub"  # the hub's log, for a failed run
        artifacts.mkdir(parents=True, exist_ok=True)
        (artifacts / "jupyterhub.log").write_text(hub.log_tail(2_000_000))
        shutil.rmtree(STATE, ignore_errors=True)


@pytest.fixture(scope="module")
def chromium(request):
    """One headless Chromium for a module's tests; each user gets a context of its own (own cookies).

    Module-scoped: Playwright's sync API keeps an event loop running on the main thread while it is
    started, and a test after it that runs a loop of its own (tests/hub/test_hub_kernel_ws.py), or the
    browser tier's own Playwright in the same pytest process (``make test``'s lane b), would fail."""
    from playwright.sync_api import expect, sync_playwright

    expect.set_options(timeout=browser_tier.EXPECT_TIMEOUT_MS)
    args = list(browser_tier.CHROMIUM_ARGS) + (["--no-sandbox"] if os.getuid() == 0 else [])
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=browser_tier._chromium_path(request.config),
                                     headless=True, args=args)
        try:
            yield browser
        finally:
            browser.close()
