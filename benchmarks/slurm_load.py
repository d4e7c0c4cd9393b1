"""A class through one Slurm queue: N students each submit a short 2-rank launch within a minute.

Starts the private Slurm of scripts/slurm_local.py (one node, 8 dummy GRES
GPUs, the machine's CPUs), then one Python process per student, the k-th
starting at k * WINDOW / N seconds, runs
``parlab.launch(work, nproc=2, gpus=2, scheduler="slurm")`` where ``work``
sleeps WORK seconds and does one gloo all_reduce.  Per launch it records:

* wait: submit (the call) -> the first rank runs ``work`` (what the student waits for);
* run: the first rank runs ``work`` -> the call returns;
* held: Slurm lists the job RUNNING -> Slurm no longer lists it (polled every 0.25 s);
* overhead: held - the time ``work`` itself took (start-up, process group, tear-down);
* gap: how long GPUs stay free between one job leaving and the next starting while jobs wait.

At the end it counts parlab jobs left in squeue and launch processes left,
stops the daemons by pid, and projects onto one DGX (8 GPUs) where 30
students each run an 8-GPU sweep of SWEEP seconds: the jobs run one at a
time, so the k-th waits about (k - 1) * (SWEEP + overhead + gap).

    flock /tmp/parlab-cpu.lock env OMP_NUM_THREADS=1 .venv/bin/python benchmarks/slurm_load.py [--students 30]

Needs root and the Debian packages slurmctld slurmd slurm-client munge.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import textwrap
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

STUDENT = textwrap.dedent("""
    import json, os, sys, time
    import parlab

    def work(seconds):
        import time
        import torch
        import torch.distributed as dist
        began = time.time()
        time.sleep(seconds)
        t = torch.ones(1)
        dist.all_reduce(t)
        return began, time.time(), os.environ.get("SLURM_JOB_ID", "")

    student, at, seconds = int(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3])
    time.sleep(max(0.0, at - time.time()))
    record = {"student": student, "submit": time.time()}
    try:
        ranks = parlab.launch(work, args=(seconds,), nproc=2, gpus=2, scheduler="slurm",
                              backend="gloo", timeout=120)
        record.update(first=min(r[0] for r in ranks), last=max(r[1] for r in ranks), jobid=ranks[0][2])
    except Exception as e:  # reported, counted as not finished
        record["error"] = f"{type(e).__name__}: {e}"[:300]
    record["returned"] = time.time()
    print("RECORD " + json.dumps(record), flush=True)
""")


def _load(name: str, *where: str):
    spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, *where))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class QueueWatch(threading.Thread):
    """Polls squeue: per job id, when it was first seen RUNNING and when it was last listed."""

    def __init__(self, period=0.25):
        super().__init__(daemon=True)
        self.period, self.stop, self.jobs = period, threading.Event(), {}

    def run(self):
        while not self.stop.is_set():
            out = subprocess.run(["squeue", "-h", "-o", "%i|%T|%j"], capture_output=True, text=True)
            now = time.time()
            for line in out.stdout.splitlines():
                jobid, state, name = (line.split("|") + ["", ""])[:3]
                if not name.startswith("parlab-"):
                    continue
                seen = self.jobs.setdefault(jobid, {"listed": now, "running": None, "gone": now})
                seen["gone"] = now + self.period  # last seen; it left within one period after
                if state != "PENDING" and seen["running"] is None:
                    seen["running"] = now
            self.stop.wait(self.period)


def gaps(held: list[tuple[float, float]]) -> list[float]:
    """For each job start after the first: the time since the latest job end before it, if any
    job ended while it waited (the GPUs' idle time between jobs)."""
    ends = sorted(e for _, e in held)
    found = []
    for start, _ in sorted(held)[1:]:
        before = [e for e in ends if e <= start]
        if before and start - before[-1] < 30:
            found.append(start - before[-1])
    return found


def fmt(values: list[float]) -> str:
    if not values:
        return "none"
    return f"median {statistics.median(values):5.1f} s, max {max(values):5.1f} s (n={len(values)})"


def project(students: int, sweep: float, per_job: float, window: float) -> tuple[list[float], list[float]]:
    """Waits on one 8-GPU machine, jobs one at a time in arrival order: all at once, and spread
    evenly over `window` seconds."""
    cycle = sweep + per_job
    together = [k * cycle for k in range(students)]
    spread, free_at = [], 0.0
    for k in range(students):
        arrive = k * window / students
        begin = max(arrive, free_at)
        spread.append(begin - arrive)
        free_at = begin + cycle
    return together, spread


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--students", type=int, default=30)
    p.add_argument("--window", type=float, default=60.0, help="seconds over which they submit")
    p.add_argument("--work", type=float, default=2.0, help="seconds each launch's ranks work")
    p.add_argument("--sweep", type=float, default=20.0, help="the projected DGX sweep's seconds")
    p.add_argument("--limit", type=float, default=330.0, help="seconds before unfinished students are stopped")
    a = p.parse_args(argv)
    local = _load("slurm_local", "scripts", "slurm_local.py")
    helpers = _load("slurm_helpers", "tests", "slurm", "slurm_helpers.py")  # jobs and processes left
    where = tempfile.mkdtemp(prefix="parlab-slurm-load-")
    jobs_root = os.path.join(where, "tmp")
    os.makedirs(jobs_root)
    began = time.time()
    local.start(os.path.join(where, "slurm"), nodes=1)
    env = {**os.environ, "SLURM_CONF": os.path.join(where, "slurm", "slurm.conf"), "TMPDIR": jobs_root,
           "OMP_NUM_THREADS": "1", "PYTHONPATH": os.path.join(ROOT, "src")}
    env.pop("PARLAB_SCHEDULER", None)
    os.environ["SLURM_CONF"] = env["SLURM_CONF"]
    script = os.path.join(where, "student.py")
    with open(script, "w") as f:
        f.write(STUDENT)
    watch = QueueWatch()
    students, records = [], []
    try:
        watch.start()
        zero = time.time() + 5.0  # every student process is up (imports done) before the first submits
        for k in range(a.students):
            at = zero + k * a.window / a.students
            students.append(subprocess.Popen([sys.executable, script, str(k), str(at), str(a.work)], env=env,
                                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                             start_new_session=True))
        deadline = zero + a.limit
        for proc in students:
            try:
                out, err = proc.communicate(timeout=max(1.0, deadline - time.time()))
            except subprocess.TimeoutExpired:
                proc.send_signal(signal.SIGINT)  # the stop button
                try:
                    out, err = proc.communicate(timeout=30)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    out, err = proc.communicate()
            line = next((l for l in out.splitlines() if l.startswith("RECORD ")), None)
            records.append(json.loads(line[7:]) if line else {"error": (err.strip().splitlines() or ["?"])[-1]})
        time.sleep(1.0)
        watch.stop.set()
        watch.join()
        tempfile.tempdir = jobs_root  # what helpers.launch_processes looks under
        left_jobs = helpers.parlab_jobs()
        left_procs = helpers.launch_processes() + [p.pid for p in students if p.poll() is None]
    finally:
        watch.stop.set()
        for proc in students:
            if proc.poll() is None:
                proc.kill()
        local.stop(os.path.join(where, "slurm"))
        shutil.rmtree(where, ignore_errors=True)
    done = [r for r in records if "first" in r]
    waits = [r["first"] - r["submit"] for r in done]
    runs = [r["returned"] - r["first"] for r in done]
    work = {r["jobid"]: r["last"] - r["first"] for r in done}
    held = {j: (s["running"], s["gone"]) for j, s in watch.jobs.items() if s["running"] is not None}
    overhead = [held[j][1] - held[j][0] - w for j, w in work.items() if j in held]
    gap = gaps(list(held.values()))
    cpus = os.cpu_count()
    print(f"slurm_load: {a.students} students, one 2-rank launch each (gpus=2, gloo, work {a.work:g} s), "
          f"submitted over {a.window:g} s; one Slurm node, 8 GRES GPUs, {cpus} CPUs")
    print(f"  finished          {len(done)} of {a.students}")
    for r in records:
        if "error" in r:
            print(f"  failed: {r['error']}")
    print(f"  wait (submit -> ranks run)       {fmt(waits)}")
    print(f"  run  (ranks run -> call returns) {fmt(runs)}")
    print(f"  GPUs held per job (squeue)       {fmt([e - s for s, e in held.values()])}")
    print(f"  overhead = held - work           {fmt(overhead)}")
    print(f"  GPUs idle between jobs (gap)     {fmt(gap)}")
    print(f"  most jobs running at once        {most_at_once(list(held.values()))} (the 8 GPUs allow "
          f"{local.GPUS // 2}; each job's one task takes a core of the node's {cpus})")
    print(f"  left after: {len(left_jobs)} parlab job(s) in squeue, {len(left_procs)} launch process(es)")
    print(f"  whole run {time.time() - began:.0f} s")
    if overhead:
        per_job = statistics.median(overhead) + (statistics.median(gap) if gap else 0.0)
        together, spread = project(30, a.sweep, per_job, a.window)
        print(f"projection: one DGX (8 GPUs), 30 students each run an 8-GPU sweep of {a.sweep:g} s; such jobs "
              f"run one at a time, each holding the GPUs {a.sweep:g} s + {per_job:.1f} s (the median overhead "
              f"+ gap measured above); the k-th waits (k-1) x {a.sweep + per_job:.1f} s")
        print(f"  all 30 submit at once:        median wait {statistics.median(together):5.0f} s, "
              f"max {max(together):5.0f} s")
        print(f"  spread evenly over {a.window:g} s:    median wait {statistics.median(spread):5.0f} s, "
              f"max {max(spread):5.0f} s")
        print("  assumes: first come first served (fair share reorders who waits, not the total), the "
              "overhead measured here on CPU (a DGX adds CUDA and NCCL start-up, not measured here), "
              "nothing else on the GPUs")
    return 0 if len(done) == a.students and not left_jobs and not left_procs else 1


def most_at_once(held: list[tuple[float, float]]) -> int:
    events = sorted([(s, 1) for s, _ in held] + [(e, -1) for _, e in held])
    now = best = 0
    for _, step in events:
        now += step
        best = max(best, now)
    return best


if __name__ == "__main__":
    sys.exit(main())
