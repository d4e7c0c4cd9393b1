"""The toolbar's stop button during a long launch."""
from __future__ import annotations

import time

import pytest

pytestmark = [pytest.mark.browser, pytest.mark.timeout(240)]
expect = pytest.importorskip("playwright.sync_api", reason="browser tier: playwright is not "
                             "installed (pip install -e '.[browser]')").expect

LONG_LAUNCH = '''import time

import torch.distributed as dist
import parlab


def sleepy():
    print("sleeping", flush=True)
    time.sleep(60)
    return dist.get_rank()


parlab.launch(sleepy, nproc=2, timeout=300)
'''
NEXT_LAUNCH = '''def again():
    print("back again", flush=True)
    return dist.get_rank() * 10


parlab.launch(again, nproc=2)
'''


def alive(pids) -> set[int]:
    """The pids that are still running (a zombie has ended: it only waits to be reaped)."""
    running = set()
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z":
            running.add(pid)
    return running


def fork_servers(pids) -> set[int]:
    """The kernel's fork server (parlab.launch.fork_server) among ``pids``: it is the kernel's and outlives
    a launch. Its forks (torchrun, the ranks) share its command line, so it is the one whose parent is not
    among them."""
    found = set()
    for pid in pids:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                server_like = b"parlab.launch.fork_server" in f.read()
            with open(f"/proc/{pid}/stat") as f:
                parent = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        if server_like and parent not in pids:
            found.add(pid)
    return found


def test_stop_button_ends_the_launch_quickly_and_leaves_nothing(open_notebook, lab_server):
    nb = open_notebook("00-setup/00-setup.ipynb")
    before = lab_server.processes()  # the server and this notebook's kernel

    cell = nb.add_cell(LONG_LAUNCH)
    nb.run(cell)
    # Both ranks are up and asleep once each has printed.
    expect(nb.outputs(cell).locator("pre", has_text="sleeping")).to_have_count(2, timeout=90_000)
    started = lab_server.processes() - before
    servers = fork_servers(started)
    launch = started - servers
    assert len(launch) >= 3, f"expected torchrun and 2 ranks under this server, found {launch}"
    assert len(servers) <= 1, f"more than one fork server for one kernel: {servers}"
    nb.screenshot("stop-button-before", cell)

    nb.interrupt()
    pressed = time.monotonic()
    nb.wait_done(cell, timeout=30)
    took = time.monotonic() - pressed
    nb.screenshot("stop-button-after", cell)
    assert took < 3.0, f"the cell ended {took:.1f} s after the stop button (limit 3 s)"
    stderr = nb.top_level(cell, "application/vnd.jupyter.stderr")
    expect(stderr.filter(has_text="KeyboardInterrupt")).to_have_count(1)

    left = alive(launch) | alive(lab_server.processes() - before - servers)
    assert not left, f"processes of the stopped launch still run: {sorted(left)}"

    again = nb.add_cell(NEXT_LAUNCH)
    nb.run_and_wait(again, timeout=120)
    expect(nb.top_level(again, "text/plain")).to_have_text("[0, 10]")
    expect(nb.outputs(again).locator("pre", has_text="back again")).to_have_count(2)
    nb.screenshot("stop-button-next-launch", again)
