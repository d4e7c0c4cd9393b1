"""Warm ranks in JupyterLab: ``%parlab start``, two ``%%rank`` cells sharing state, ``%parlab stop``."""
from __future__ import annotations

import ast
import time

import pytest

pytestmark = [pytest.mark.browser, pytest.mark.timeout(300)]
expect = pytest.importorskip("playwright.sync_api", reason="browser tier: playwright is not "
                             "installed (pip install -e '.[browser]')").expect

NPROC = 3
START = f"%load_ext parlab\n%parlab start -n {NPROC}"
FIRST = '''%%rank
import os
kept = f"kept by rank {rank} of {world_size}"
print(f"hello from warm rank {rank}")
os.getpid()
'''
SECOND = '''%%rank
print(f"rank {rank} still has: {kept}")
os.getpid()
'''
PIDS = "from parlab.launch import warm\nwarm.current().pids()"
TEXT = "text/plain"


def result_of(nb, cell):
    """The Python value that the cell's result (its Out[n]) shows."""
    out = nb.top_level(cell, TEXT)
    expect(out).to_have_count(1)
    return ast.literal_eval(out.inner_text().strip())


def assert_each_rank_printed_in_its_own_area(nb, cell, line_of) -> None:
    for rank in range(NPROC):
        line = line_of(rank)
        expect(nb.printed(cell, line)).to_be_visible()
        assert nb.owning_ranks(cell, line) == [f"rank {rank}"], (
            f"{line!r} is not shown in rank {rank}'s own output area")
    expect(nb.rank_labels(cell)).to_have_count(NPROC)


def test_warm_group_keeps_state_between_rank_cells_and_stop_leaves_no_process(open_notebook, lab_server):
    nb = open_notebook("00-setup/00-setup.ipynb")

    start = nb.add_cell(START)
    nb.run_and_wait(start, timeout=180)
    expect(nb.outputs(start)).to_contain_text(f"parlab: {NPROC} warm ranks (gloo) ready")

    first = nb.add_cell(FIRST)
    nb.run_and_wait(first, timeout=60)
    assert_each_rank_printed_in_its_own_area(nb, first, lambda r: f"hello from warm rank {r}")
    rank_pids = result_of(nb, first)

    second = nb.add_cell(SECOND)
    nb.run_and_wait(second, timeout=60)
    nb.screenshot("warm-second-rank-cell", second)
    assert_each_rank_printed_in_its_own_area(
        nb, second, lambda r: f"rank {r} still has: kept by rank {r} of {NPROC}")
    assert result_of(nb, second) == rank_pids, "the second %%rank cell ran in other processes"

    pids = nb.add_cell(PIDS)
    nb.run_and_wait(pids, timeout=30)
    group = result_of(nb, pids)
    assert group["ranks"] == rank_pids, f"the group's ranks {group['ranks']} are not {rank_pids}"
    started = {group["torchrun"], *rank_pids}
    assert started <= lab_server.processes(), (
        f"torchrun and the ranks {sorted(started)} are not all running under this server")

    stop = nb.add_cell("%parlab stop")
    nb.run_and_wait(stop, timeout=60)
    nb.screenshot("warm-after-stop", stop)
    expect(nb.outputs(stop)).to_contain_text("parlab: the 3 warm ranks stopped")
    deadline = time.monotonic() + 10  # stop() ends what is left by pid before it returns
    while (left := started & lab_server.processes()) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not left, f"processes of the stopped warm group still run: {sorted(left)}"

    after = nb.add_cell("%%rank\nrank")
    nb.run_and_wait(after, timeout=30)
    expect(nb.outputs(after)).to_contain_text("no warm group is running")
