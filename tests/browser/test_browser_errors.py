"""A rank that raises, as rendered in JupyterLab."""
from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

pytestmark = [pytest.mark.browser, pytest.mark.timeout(240)]
expect = pytest.importorskip("playwright.sync_api", reason="browser tier: playwright is not "
                             "installed (pip install -e '.[browser]')").expect

STDERR = "application/vnd.jupyter.stderr"
RAISING_LINE = 'raise ValueError("the shard is empty")'
RAISES_ON_ONE_RANK = f'''import torch.distributed as dist
import parlab


def load_shard():
    if dist.get_rank() == 1:
        {RAISING_LINE}
    return dist.get_rank()


parlab.launch(load_shard, nproc=2)
'''
SLEEPS = '''import time


def sleepy():
    print("sleeping", flush=True)
    time.sleep(60)


parlab.launch(sleepy, nproc=2, timeout=300)
'''


def parlab_frames(text: str) -> list[str]:
    """Traceback frame headers that point into the parlab package itself."""
    package = str(Path(importlib.util.find_spec("parlab").origin).parent)
    return [line for line in text.splitlines()
            if line.lstrip().startswith("File ") and package in line or "_Job." in line]


def test_error_on_one_rank_names_the_rank_and_shows_the_cell_line(open_notebook):
    nb = open_notebook("00-setup/00-setup.ipynb")
    cell = nb.add_cell(RAISES_ON_ONE_RANK)
    nb.run_and_wait(cell, timeout=120)
    nb.screenshot("error-on-rank-1", cell)

    error = nb.top_level(cell, STDERR).filter(has_text="WorkerError")
    expect(error).to_have_count(1)
    text = error.inner_text()
    assert re.search(r"\brank 1\b", text), f"the error does not name rank 1:\n{text}"
    assert "ValueError" in text and "the shard is empty" in text, text
    assert RAISING_LINE in text, f"the error does not show the cell's line {RAISING_LINE!r}:\n{text}"
    assert re.search(r"Cell In\[\d+\], line 7", text), f"no 'Cell In[n], line 7' in:\n{text}"


def test_tracebacks_show_the_cell_and_the_rank_but_no_launcher_frames(open_notebook):
    nb = open_notebook("00-setup/00-setup.ipynb")
    failing = nb.add_cell(RAISES_ON_ONE_RANK)
    nb.run_and_wait(failing, timeout=120)
    error = nb.top_level(failing, STDERR).filter(has_text="WorkerError")
    expect(error).to_have_count(1)
    nb.screenshot("error-frames", failing)

    sleeping = nb.add_cell(SLEEPS)
    nb.run(sleeping)
    expect(nb.outputs(sleeping).locator("pre", has_text="sleeping")).to_have_count(2, timeout=90_000)
    nb.interrupt()
    nb.wait_done(sleeping, timeout=30)
    interrupted = nb.top_level(sleeping, STDERR).filter(has_text="KeyboardInterrupt")
    expect(interrupted).to_have_count(1)
    nb.screenshot("interrupt-frames", sleeping)

    shown = {"WorkerError": parlab_frames(error.inner_text()),
             "KeyboardInterrupt": parlab_frames(interrupted.inner_text())}
    assert shown == {"WorkerError": [], "KeyboardInterrupt": []}, shown
