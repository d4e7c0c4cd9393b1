"""Fixtures of the browser tier: a private JupyterLab per test, driven by Chromium.

``tests/conftest.py`` skips this tier when Chromium or Playwright is missing;
nothing here imports Playwright before a test of the tier runs, so the rest of
the suite collects without it.
Chromium is the system binary (Playwright cannot download its own browsers
here), started headless with everything that would call out to the network
turned off: on a closed network those calls are refused and slow it down.
"""
from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

from lab_server import LabServer

# Playwright adds --headless itself (headless=True below).
CHROMIUM_ARGS = [
    "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--disable-dev-shm-usage",
]
VIEWPORT = {"width": 1400, "height": 1000}
# On 2 busy cores JupyterLab's page takes tens of seconds to load and a launch
# tens of seconds to start: waits are long, and end as soon as the page is there.
PAGE_TIMEOUT_MS = 120_000
EXPECT_TIMEOUT_MS = 20_000


def _chromium_path(config) -> str:
    """The binary tests/conftest.py found (its ``browser_executable``)."""
    for plugin in config.pluginmanager.get_plugins():
        find = getattr(plugin, "browser_executable", None)
        if callable(find) and find():
            return find()
    pytest.skip("no Chromium found (apt-get install chromium, or set PARLAB_CHROMIUM)")


@pytest.fixture
def chromium(request):
    """A headless Chromium of this test's own, with a fresh profile folder.

    Per test, not per session: a test that drives Playwright itself (the
    slides test) cannot start while another sync Playwright is running.
    """
    from playwright.sync_api import expect, sync_playwright

    expect.set_options(timeout=EXPECT_TIMEOUT_MS)
    args = list(CHROMIUM_ARGS)
    if os.getuid() == 0:
        args.append("--no-sandbox")  # Chromium refuses to sandbox as root
    with tempfile.TemporaryDirectory(prefix="parlab-chromium-") as profile, \
            sync_playwright() as pw:
        # A persistent context is how Playwright takes a --user-data-dir.
        context = pw.chromium.launch_persistent_context(
            profile, executable_path=_chromium_path(request.config), headless=True,
            args=args, viewport=VIEWPORT)
        try:
            yield context
        finally:
            context.close()


@pytest.fixture
def lab_server(tmp_path: Path):
    """A JupyterLab of this test's own, on a copy of labs/; stopped with all it started."""
    server = LabServer(tmp_path).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def open_notebook(chromium, lab_server, request):
    """``open_notebook("00-setup/00-setup.ipynb")``: a new tab on a fresh workspace."""
    from notebook_ui import Notebook  # imports playwright, which only this tier needs

    pages = []

    def opener(path: str) -> Notebook:
        page = chromium.new_page()
        page.set_default_timeout(PAGE_TIMEOUT_MS)
        pages.append(page)
        workspace = f"{request.node.name}-{len(pages)}".replace("[", "-").replace("]", "")
        page.goto(lab_server.lab_url(path, workspace))
        return Notebook(page).wait_ready()

    yield opener
    for page in pages:
        page.close()
