"""In IPython, a launch error shows the student's cell and the rank's traceback, no launcher frame."""
from __future__ import annotations

import contextlib
import io

import pytest

from parlab.launch import tracebacks

pytestmark = [pytest.mark.ranks, pytest.mark.timeout(180)]

CELL = '''
import parlab, torch.distributed as dist

def load_shard():
    if dist.get_rank() == 1:
        raise ValueError("the shard is empty")

parlab.launch(load_shard, nproc=2)
'''


def test_ipython_shows_no_launcher_frame():
    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance(colors="nocolor")
    shell.set_custom_exc((), None)
    assert tracebacks.install()
    assert not tracebacks.install()  # never replaces a handler already there
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        result = shell.run_cell(CELL)
    text = out.getvalue()
    assert type(result.error_in_exec).__name__ == "WorkerError"
    assert "rank 1 failed: ValueError: the shard is empty" in text, text
    assert "parlab.launch(load_shard, nproc=2)" in text, text
    assert "parlab/launch" not in text, text


def test_cutting_keeps_a_traceback_without_launcher_frames():
    def user_code():
        raise KeyError("plain")
    try:
        user_code()
    except KeyError as err:
        tb = err.__traceback__
    assert tracebacks.without_launcher_frames(tb) is tb and tb.tb_next is not None
