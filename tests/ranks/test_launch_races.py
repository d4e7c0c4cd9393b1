"""Failure reports that must not depend on timing: each race is run many times."""
import os
import signal
import time

import pytest
import torch
import torch.distributed as dist

import parlab

pytestmark = [pytest.mark.ranks, pytest.mark.timeout(600)]

ROUNDS = int(os.environ.get("PARLAB_RACE_ROUNDS", "6"))


def every_rank_raises():
    dist.barrier()  # every rank raises at the same moment, as a stub every rank runs would
    raise NotImplementedError("write me")


def test_when_every_rank_raised_the_report_reads_complete_records():
    for i in range(ROUNDS):
        with pytest.raises(parlab.WorkerError) as info:
            parlab.launch(every_rank_raises, nproc=3, timeout=90)
        text = str(info.value)
        assert "_atomic_write" not in text and "atomic_write" not in text, f"round {i}:\n{text}"
        others = [line for line in text.splitlines() if line.startswith("  rank ")]
        assert len(others) == 2 and all("raised NotImplementedError" in line for line in others), \
            f"round {i}:\n{text}"


def crash_in_c_on_rank_one(how):
    if dist.get_rank() == 1:
        time.sleep(0.2)
        if how == "kill":
            os.kill(os.getpid(), signal.SIGSEGV)
        import ctypes
        ctypes.string_at(0)
    dist.all_reduce(torch.ones(1))  # rank 0 waits here until torchrun stops it


@pytest.mark.parametrize("how", ["string_at", "kill"])
def test_the_rank_that_crashed_in_c_is_blamed_every_time(how):
    for i in range(ROUNDS // 2):
        with pytest.raises(parlab.WorkerError) as info:
            parlab.launch(crash_in_c_on_rank_one, args=(how,), nproc=2, timeout=90)
        err = info.value
        assert err.rank == 1 and err.exc_type == "SIGSEGV", f"round {i}:\n{err}"
        assert str(err).startswith("rank 1 died without raising a Python exception"), f"round {i}:\n{err}"
