"""Warm ranks vs cold launches: latency of one cell, and what each fault drill leaves behind.

One cell = one all_reduce on every rank and the result returned to the notebook.

- warm: ``parlab.start(nproc=N)`` once, then ``--cells`` calls of ``g.run``;
  median and p95 of the wall time of one call;
- cold: ``parlab.launch`` of the same function, ``--cold`` times, in the same
  run, median;
- fault drills on the warm group: a rank error, a hang ended by the timeout,
  the stop button (ranks in Python code, then a rank stuck in a collective),
  a segfault, and the owner SIGKILLed.  After each, we count the processes
  left over: processes of a group folder this benchmark used that is no
  longer the live group's (for the SIGKILL drill: the dead owner's group).

    OMP_NUM_THREADS=1 python benchmarks/warm_ranks.py [--nproc 4] [--cells 100] [--cold 3]

Target (issue 16): warm / cold <= 0.05, and 0 processes left after every drill.
"""
import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import threading
import time

import psutil

import parlab
from parlab.launch import LaunchTimeout, WorkerError
from parlab.launch.jobdir import JOB_ENV


def one_cell():
    import torch
    import torch.distributed as dist

    t = torch.ones(1)
    dist.all_reduce(t)
    return t.item()


def fails_on_rank_1():
    import torch.distributed as dist

    if dist.get_rank() == 1:
        raise ValueError("drill: rank 1 raises")
    return 0


def sleeps(seconds):
    import time

    time.sleep(seconds)


def rank_0_waits_in_a_collective():
    import time

    import torch
    import torch.distributed as dist

    if dist.get_rank() == 0:
        dist.all_reduce(torch.ones(1))  # the others never join: rank 0 waits inside gloo
    time.sleep(600)


def segfaults_on_rank_1():
    import ctypes

    import torch.distributed as dist

    if dist.get_rank() == 1:
        ctypes.string_at(0)


def processes_in(folders) -> list:
    """pids of this user's processes whose launch folder is one of ``folders``."""
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.pid != os.getpid() and proc.environ().get(JOB_ENV) in folders:
                found.append(proc.pid)
        except (psutil.Error, OSError):
            continue
    return found


def left_over(used: set, group, settle: float = 3.0) -> int:
    """Processes of earlier folders that are still there after ``settle`` seconds."""
    used.add(group.job.job.path)
    old = used - {group.job.job.path}
    deadline = time.monotonic() + settle
    while processes_in(old) and time.monotonic() < deadline:
        time.sleep(0.1)
    return len(processes_in(old))


def drill(name, group, used, action, expect):
    started = time.perf_counter()
    try:
        action()
        outcome = "no error (unexpected)"
    except expect as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        kept = "restarted" not in str(exc)
        outcome = f"{type(exc).__name__}: {first[:70]}" + ("" if kept else " [group restarted]")
    seconds = time.perf_counter() - started
    left = left_over(used, group)
    answers = group.run(one_cell) == [float(group.nproc)] * group.nproc
    print(f"  {name:<34} {seconds:5.1f} s  processes left: {left}  answers after: "
          f"{'yes' if answers else 'NO'}\n      {outcome}", flush=True)
    return left


def interrupt_after(seconds):
    timer = threading.Timer(seconds, os.kill, (os.getpid(), signal.SIGINT))
    timer.start()
    return timer


OWNER = """
import json, time, parlab
g = parlab.start(nproc={n}, timeout=120)
print(json.dumps(g.job.job.path), flush=True)
time.sleep(600)
"""


def owner_sigkill(nproc: int) -> int:
    owner = subprocess.Popen([sys.executable, "-c", OWNER.format(n=nproc)], stdout=subprocess.PIPE, text=True)
    folder = json.loads(owner.stdout.readline())
    alive = len(processes_in({folder}))
    owner.kill()
    owner.wait()
    deadline = time.monotonic() + 10
    while processes_in({folder}) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = len(processes_in({folder}))
    print(f"  {'owner SIGKILLed':<34} {alive} processes before, processes left: {left}", flush=True)
    return left


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nproc", type=int, default=4)
    parser.add_argument("--cells", type=int, default=100)
    parser.add_argument("--cold", type=int, default=3)
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    n = args.nproc
    started = time.perf_counter()
    group = parlab.start(nproc=n, timeout=120)
    print(f"warm group of {n} ranks started in {time.perf_counter() - started:.1f} s", flush=True)
    for _ in range(3):  # the first calls load the function's modules on the ranks
        group.run(one_cell)
    warm = []
    for _ in range(args.cells):
        t = time.perf_counter()
        assert group.run(one_cell) == [float(n)] * n
        warm.append(time.perf_counter() - t)
    cold = []
    for _ in range(args.cold):
        t = time.perf_counter()
        assert parlab.launch(one_cell, nproc=n) == [float(n)] * n
        cold.append(time.perf_counter() - t)
    med, p95 = statistics.median(warm), sorted(warm)[max(0, round(0.95 * len(warm)) - 1)]
    cold_med = statistics.median(cold)
    print(f"\n{n} ranks, one all_reduce + result per cell ({os.cpu_count()} CPU cores, "
          f"OMP_NUM_THREADS={os.environ['OMP_NUM_THREADS']}):")
    print(f"  warm cell   median {med * 1000:7.1f} ms   p95 {p95 * 1000:7.1f} ms   ({len(warm)} cells)")
    print(f"  cold launch median {cold_med * 1000:7.1f} ms   ({len(cold)} launches: "
          + ", ".join(f"{c:.1f} s" for c in cold) + ")")
    print(f"  warm / cold = {med / cold_med:.4f}   (target <= 0.05)\n", flush=True)

    print("fault drills (processes left = processes of replaced groups still running):", flush=True)
    used = {group.job.job.path}
    lefts = [
        drill("rank error", group, used, lambda: group.run(fails_on_rank_1), WorkerError),
        drill("hang + timeout (5 s)", group, used, lambda: group.call(sleeps, (600,), timeout=5), LaunchTimeout),
        drill("interrupt (ranks in Python)", group, used,
              lambda: (interrupt_after(1.0), group.run(sleeps, 600)), KeyboardInterrupt),
        drill("interrupt (rank 0 in a collective)", group, used,
              lambda: (interrupt_after(1.0), group.run(rank_0_waits_in_a_collective)), KeyboardInterrupt),
        drill("segfault on rank 1", group, used, lambda: group.run(segfaults_on_rank_1), WorkerError),
        owner_sigkill(n),
    ]
    last = group.job.job.path
    group.stop()
    time.sleep(1)
    stopped = len(processes_in({last}))
    print(f"  {'stop()':<34} processes left: {stopped}")
    print(f"\nprocesses left after the drills: {lefts + [stopped]} (target: all 0)")


if __name__ == "__main__":
    main()
