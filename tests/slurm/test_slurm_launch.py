"""Launches through a real Slurm queue (the cluster of conftest.py): results, waits, stops, limits.

The ranks run on gloo: Slurm hands out the 8 dummy GPUs of node n1 as GRES
and sets CUDA_VISIBLE_DEVICES, but there is no CUDA here.  Every test ends
with no parlab job in squeue and no launch process left (conftest.nothing_left).
"""
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

import parlab
from slurm_helpers import parlab_jobs, wait_for

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(240)]


def facts(scale):
    import torch
    import torch.distributed as dist

    t = torch.ones(2) * (dist.get_rank() + 1) * scale
    dist.all_reduce(t)
    print(f"rank {dist.get_rank()} of {dist.get_world_size()}", flush=True)
    return dist.get_rank(), dist.get_world_size(), t.tolist(), torch.rand(1).item()


def gpus_seen():
    return os.environ.get("CUDA_VISIBLE_DEVICES"), os.environ.get("SLURM_JOB_ID") is not None


def fails_on_rank_one():
    import torch.distributed as dist

    if dist.get_rank() == 1:
        raise ValueError("bad shape on rank one")
    dist.barrier()


def test_a_queued_launch_returns_what_a_local_one_returns(capfd):
    local = parlab.launch(facts, args=(3,), nproc=2)
    queued = parlab.launch(facts, args=(3,), nproc=2, scheduler="slurm", gpus=2)
    assert queued == local
    assert "[rank 1] rank 1 of 2" in capfd.readouterr().out  # streamed like a local launch
    seen = parlab.launch(gpus_seen, nproc=2, scheduler="slurm", gpus=2)
    assert seen[0][1] and len(seen[0][0].split(",")) == 2, seen  # Slurm allocated 2 GRES GPUs


def test_a_rank_error_through_the_queue_names_the_rank_and_its_traceback():
    with pytest.raises(parlab.WorkerError) as info:
        parlab.launch(fails_on_rank_one, nproc=2, scheduler="slurm", gpus=2, timeout=60)
    assert info.value.rank == 1 and "bad shape on rank one" in info.value.remote_traceback


def test_ranks_over_two_slurm_nodes_see_their_node_and_local_rank():
    def where():
        return tuple(int(os.environ[k]) for k in ("RANK", "GROUP_RANK", "LOCAL_RANK"))

    got = parlab.launch(where, nproc=4, nnodes=2, gpus=4, scheduler="slurm", partition="two")
    assert sorted(g for _, g, _ in got) == [0, 0, 1, 1]
    assert all(r == g * 2 + lr for r, g, lr in got), got


def test_bad_input_is_refused_before_anything_is_queued(monkeypatch, tmp_path):
    with pytest.raises(ValueError, match="no partition 'nope'.*gpu, two"):
        parlab.launch(facts, args=(1,), scheduler="slurm", gpus=2, partition="nope")
    with pytest.raises(ValueError, match="gpus=16 .* more than partition 'gpu' holds"):
        parlab.launch(facts, args=(1,), scheduler="slurm", gpus=16)
    with pytest.raises(ValueError, match="scheduler='slurm'"):
        parlab.launch(facts, args=(1,), gpus=2)  # gpus without a scheduler
    conf = open(os.environ["SLURM_CONF"]).read().replace("SlurmctldPort=16817", "SlurmctldPort=16899")
    (tmp_path / "slurm.conf").write_text(conf)
    monkeypatch.setenv("SLURM_CONF", str(tmp_path / "slurm.conf"))
    with pytest.raises(parlab.LaunchError, match="`sinfo .*` failed.*SLURM_CONF"):
        parlab.launch(facts, args=(1,), scheduler="slurm", gpus=2)
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setenv("PARLAB_SCHEDULER", "slurm")  # routes nothing by itself: the launch asks for Slurm
    with pytest.raises(parlab.LaunchError, match="'sinfo', which is not on PATH"):
        parlab.launch(facts, args=(1,), scheduler="slurm", gpus=2)


def test_a_job_that_reaches_its_time_limit_is_a_worker_error_saying_so():
    def sleep_long():
        time.sleep(300)

    started = time.monotonic()
    with pytest.raises(parlab.WorkerError, match="reached its time limit") as info:
        parlab.launch(sleep_long, nproc=2, scheduler="slurm", gpus=2, time_limit=0.1, timeout=200)
    assert info.value.phase == "died" and time.monotonic() - started < 150


# ----------------------------------------------------------------- notebook kernels

KERNEL = """
import os, signal, sys, time, parlab
# A kernel handles SIGINT (the stop button) even when this test runs from a shell that
# started it in the background, where SIGINT arrives ignored.
signal.signal(signal.SIGINT, signal.default_int_handler)

def work(path, seconds):
    import os, time
    with open(f"{{path}}.{{os.environ['RANK']}}.part", "w") as f:
        f.write(f"{{os.getpid()}} {{time.time()}}")
    os.replace(f"{{path}}.{{os.environ['RANK']}}.part", f"{{path}}.{{os.environ['RANK']}}")
    print("rank started", flush=True)
    time.sleep(seconds)
    return time.time()

res = parlab.launch(work, args=({path!r}, {seconds}), nproc=2, scheduler="slurm", gpus={gpus}, timeout=200)
print("RESULT", min(res), flush=True)
"""


class Kernel:
    """A notebook kernel stand-in: a Python process that runs one queued launch."""

    def __init__(self, tmp_path, name, gpus, seconds):
        self.marks = str(tmp_path / name)
        script = tmp_path / f"{name}.py"
        script.write_text(KERNEL.format(path=self.marks, seconds=seconds, gpus=gpus))
        self.proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True)

    def ranks(self) -> list[tuple[int, float]]:
        found = []
        for r in (0, 1):
            try:
                pid, t = open(f"{self.marks}.{r}").read().split()
                found.append((int(pid), float(t)))
            except (OSError, ValueError):
                pass
        return found

    def wait_running(self, limit=90):
        assert wait_for("ranks", lambda: len(self.ranks()) == 2 or self.proc.poll() is not None, limit)
        assert len(self.ranks()) == 2, self.proc.communicate()

    def end(self, limit=60):
        try:
            return self.proc.communicate(timeout=limit)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            out, err = self.proc.communicate()
            raise AssertionError(f"the kernel did not end within {limit} s:\n{out}\n{err}") from None


def pending() -> list[str]:
    return [j for j in parlab_jobs() if j.endswith("PENDING")]


def test_two_launches_that_each_need_every_gpu_run_one_after_the_other(tmp_path):
    first = Kernel(tmp_path, "first", gpus=8, seconds=4)
    first.wait_running()
    second = Kernel(tmp_path, "second", gpus=8, seconds=1)
    out1, err1 = first.end()
    out2, err2 = second.end()
    assert first.proc.returncode == 0 and second.proc.returncode == 0, err1 + err2
    first_done = float(out1.split("RESULT")[1].split()[0])
    assert min(t for _, t in second.ranks()) >= first_done, "the second launch ran beside the first"
    assert "waits, position 1 in the queue (Resources" in out2, out2


def test_the_stop_button_cancels_a_waiting_and_a_running_launch(tmp_path):
    running = Kernel(tmp_path, "running", gpus=8, seconds=600)
    running.wait_running()
    waiting = Kernel(tmp_path, "waiting", gpus=8, seconds=1)
    assert wait_for("pending", pending, 30), parlab_jobs()
    waiting.proc.send_signal(signal.SIGINT)  # what Jupyter's stop button does
    out, err = waiting.end(30)
    assert "KeyboardInterrupt" in err and not waiting.ranks()
    assert wait_for("cancelled", lambda: not pending(), 15), parlab_jobs()
    running.proc.send_signal(signal.SIGINT)
    out, err = running.end(30)
    assert "KeyboardInterrupt" in err and "Interrupted. Where the ranks were:" in err, err
    assert all(not _alive(pid) for pid, _ in running.ranks())


def test_a_sigkilled_kernel_has_its_job_cancelled(tmp_path):
    kernel = Kernel(tmp_path, "killed", gpus=2, seconds=600)
    kernel.wait_running()
    os.kill(kernel.proc.pid, signal.SIGKILL)  # a kernel restart or crash
    kernel.end(10)
    assert wait_for("no job", lambda: not parlab_jobs(), 20), parlab_jobs()
    assert wait_for("ranks gone", lambda: all(not _alive(p) for p, _ in kernel.ranks()), 10)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return not open(f"/proc/{pid}/stat").read().split(") ")[1].startswith("Z")
