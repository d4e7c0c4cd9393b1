"""Lab 00 in JupyterLab, as a student meets it: the doctor, then the first 4-rank launch."""
from __future__ import annotations

import pytest

pytestmark = [pytest.mark.browser, pytest.mark.timeout(240)]
expect = pytest.importorskip("playwright.sync_api", reason="browser tier: playwright is not "
                             "installed (pip install -e '.[browser]')").expect

LAB00 = "00-setup/00-setup.ipynb"

# What a student writes for Exercise 1 (the solution in solutions/00-setup).
HELLO = '''import torch.distributed as dist

import parlab


def hello() -> str:
    """Runs on every rank: print and return 'hello from rank r of N'."""
    message = f"hello from rank {dist.get_rank()} of {dist.get_world_size()}"
    print(message)
    return message
'''


def test_doctor_then_four_rank_launch_shows_each_rank_and_the_result(open_notebook):
    nb = open_notebook(LAB00)

    doctor = nb.code_cell("doctor.main()")
    nb.run_and_wait(doctor, timeout=120)
    expect(nb.outputs(doctor)).to_contain_text("parlab doctor: all good")
    nb.screenshot("lab00-doctor", doctor)
    # The doctor's ranks print nothing: no empty "rank 0 / rank 1" strip, under
    # which the doctor's own report would look as if rank 0 had printed it.
    expect(nb.rank_labels(doctor)).to_have_count(0)

    exercise = nb.code_cell("def hello()")
    nb.set_source(exercise, HELLO)
    nb.run_and_wait(exercise)

    launch = nb.code_cell("parlab.launch(hello, nproc=4)")
    nb.run_and_wait(launch, timeout=120)
    nb.screenshot("lab00-first-launch", launch)

    for rank in range(4):
        line = f"hello from rank {rank} of 4"
        expect(nb.printed(launch, line)).to_be_visible()
        assert nb.owning_ranks(launch, line) == [f"rank {rank}"], (
            f"{line!r} is not shown in rank {rank}'s own output area")
    expect(nb.rank_labels(launch)).to_have_count(4)

    result = nb.top_level(launch, "text/plain")
    expect(result).to_have_count(1)
    for rank in range(4):
        expect(result).to_contain_text(f"'hello from rank {rank} of 4'")

