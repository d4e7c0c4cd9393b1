"""Slurm for ``parlab grade --slurm``: checked before anything is queued, one array job, its tasks.

Everything goes through the Slurm client commands, as launches on Slurm do
(``parlab.launch.slurm``), with the same probe and messages: ``check``
runs ``sinfo`` through ``check_request`` (is the controller reachable, is
there such a partition, is the time limit a number of minutes) and asks
the cluster how many CPUs its nodes have and how large an array it takes
(``MaxArraySize``), so a request Slurm would refuse or hold forever is
refused here, with what to pass instead.  ``submit`` queues one ``sbatch
--array`` job; ``task_states`` reads its tasks from ``squeue``;
``why_ended`` reads why Slurm ended a task from the task's log, where
slurmstepd writes it ("CANCELLED AT ... DUE TO TIME LIMIT"), which works
with or without Slurm's accounting database (``sacct`` needs one).

The job's name (``parlab-grade-LAB-TOKEN``) is unique to one run and is
recorded in ``.parlab-grade/LAB/slurm/job.json`` until the run ends, so a
run whose command was killed outright has its array cancelled by the next.
"""
from __future__ import annotations

import json
import math
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from parlab.launch import slurm
from parlab.launch.errors import LaunchError

JOB_FILE = "job.json"


@dataclass(frozen=True)
class ArrayRequest:
    partition: str
    account: str | None
    time_limit: int | None  # seconds per task; None: the partition's default
    cpus_per_task: int
    mem_mb: int = 0                  # per task
    throttle: int | None = None      # at most this many tasks at once (``--array=...%N``)
    reservation: str | None = None
    qos: str | None = None

#: Memory per array task when --mem-per-task is not given: this much per rank of the lab's widest
#: launch, plus as much again for nbgrader and the notebook's kernel.  A process that has imported
#: torch and parlab holds about 230 MB here (torch 2.13 CPU build), so this leaves room to spare.
DEFAULT_MEM_PER_RANK = "1G"


class ArrayError(Exception):
    """Slurm cannot take the array job as asked (the message says what to do); nothing was queued."""


def check(partition: str | None, account: str | None, time_limit: float | None,
          cpus_per_task: int | None, widest: int, submissions: int, chunk: int, mem: str | None = None,
          throttle: int | None = None, reservation: str | None = None, qos: str | None = None) -> ArrayRequest:
    """What the array asks for, once Slurm has confirmed it can hold it; raises ArrayError before queuing.

    ``mem``: memory per task in Slurm's units (default 1G per rank of the widest launch, plus 1G).
    """
    try:
        req = _check(partition, account, time_limit, cpus_per_task, widest, submissions, chunk)
        return _with_memory(req, widest, mem, throttle, reservation, qos)
    except LaunchError as exc:  # the client is missing or the controller unreachable: launch.slurm's words
        raise ArrayError(f"{exc} For parlab grade: leave out --slurm to grade with workers on this machine.") \
            from None
    except ValueError as exc:
        raise ArrayError(str(exc)) from None


def _check(partition, account, time_limit, cpus_per_task, widest, submissions, chunk) -> ArrayRequest:
    for tool in ("sbatch", "squeue", "scancel"):
        slurm.run_client([tool, "--version"])
    _, req = slurm.check_request(1, 0, 1, partition, account, time_limit, per_gpu=False)
    cpus = max((int(n) for n in slurm.run_client(["sinfo", "-h", "-N", "-p", req.partition, "-o", "%c"]).split()
                if n.isdigit()), default=1)
    if cpus_per_task is None:
        cpus_per_task = min(widest, cpus)
    elif cpus_per_task > cpus:
        raise ValueError(f"--cpus-per-task {cpus_per_task} but the nodes of partition {req.partition!r} "
                         f"have at most {cpus} CPUs; the tasks would wait forever. Pass --cpus-per-task {cpus} "
                         "or less, or another --partition.")
    most, tasks = max_array_size(), math.ceil(submissions / chunk)
    if most is not None and tasks > most:
        raise ValueError(f"{tasks} array tasks is more than this cluster allows (MaxArraySize={most}); "
                         f"pass --chunk {math.ceil(submissions / most)} or more so that each task grades "
                         "several submissions")
    return ArrayRequest(req.partition, req.account, req.time_limit, cpus_per_task)


def _with_memory(req: ArrayRequest, widest: int, mem, throttle, reservation, qos) -> ArrayRequest:
    from dataclasses import replace

    if mem is None:
        mb = (widest + 1) * slurm.mem_mb(DEFAULT_MEM_PER_RANK, "DEFAULT_MEM_PER_RANK")
    else:
        mb = slurm.mem_mb(mem, "--mem-per-task")
    sizes = [int(n) for n in slurm.run_client(["sinfo", "-h", "-N", "-p", req.partition, "-o", "%m"]).split()
             if n.isdigit()]
    if sizes and mb > max(sizes):
        raise ValueError(f"--mem-per-task {mb}M but the nodes of partition {req.partition!r} have at most "
                         f"{max(sizes)} MB; the tasks would wait forever. Pass --mem-per-task {max(sizes)}M or "
                         "less, or another --partition.")
    if throttle is not None and (isinstance(throttle, bool) or not isinstance(throttle, int) or throttle < 1):
        raise ValueError(f"--throttle must be a whole number of tasks, at least 1, got {throttle!r}")
    return replace(req, mem_mb=mb, throttle=throttle, reservation=reservation or None, qos=qos or None)


def max_array_size() -> int | None:
    found = re.search(r"(?m)^MaxArraySize\s*=\s*(\d+)", slurm.run_client(["scontrol", "show", "config"]))
    return int(found.group(1)) if found else None


def sbatch_command(req: ArrayRequest, name: str, tasks: int, logs: Path, cwd: Path, plan: Path) -> list[str]:
    tasks_at_once = f"%{req.throttle}" if req.throttle else ""
    cmd = ["sbatch", "--parsable", f"--job-name={name}", f"--array=0-{tasks - 1}{tasks_at_once}",
           f"--partition={req.partition}", "--nodes=1", "--ntasks=1", f"--cpus-per-task={req.cpus_per_task}",
           f"--output={logs}/task-%a.log", f"--chdir={cwd}", "--export=ALL"]
    if req.mem_mb:
        cmd.append(f"--mem={req.mem_mb}M")
    for option in ("account", "reservation", "qos"):
        if getattr(req, option):
            cmd.append(f"--{option}={getattr(req, option)}")
    if req.time_limit:
        cmd.append(f"--time={req.time_limit // 60}:{req.time_limit % 60:02d}")  # minutes:seconds
    task = [sys.executable, "-m", "parlab.classgrade.task", str(plan)]
    return cmd + ["--wrap", "exec " + shlex.join(task)]


def submit(cmd: list[str]) -> str:
    """Queue the array job; its id.  sbatch's own complaint is shown as it is (nothing was queued)."""
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ArrayError(f"sbatch did not answer ({exc}); check that `sinfo` works in a terminal") from None
    if out.returncode != 0:
        raise ArrayError(f"sbatch refused the array job: {out.stderr.strip() or out.returncode}")
    return out.stdout.strip().split(";")[0]


def task_states(name: str) -> dict[int, tuple[str, str, str]] | None:
    """{task: (state, reason, node)} of the tasks squeue lists for the job; None if squeue failed."""
    try:
        lines = slurm.run_client(["squeue", "-h", "-r", "--name", name, "-o", "%K|%T|%r|%N"], timeout=10)
    except LaunchError:
        return None
    found = {}
    for line in lines.splitlines():
        task, state, reason, node = (line.split("|") + ["", "", ""])[:4]
        if task.isdigit():
            found[int(task)] = (state, reason, node)
    return found


def why_ended(log: Path, time_limit: int | None) -> str:
    """Why Slurm ended a task, from its log (or that it never started)."""
    try:
        text = log.read_text(errors="replace")
    except OSError:
        return "it was cancelled before it started (no log)"
    why = slurm.ended_by_slurm(text)
    if "time limit" in why and time_limit:
        return f"{why} (--time-limit {time_limit / 60:g} min)"
    if why:
        return why
    if re.search(r"\*\*\* JOB \d+ ON \S+ CANCELLED AT", text):
        return "it was cancelled (scancel)"
    tail = [line for line in text.strip().splitlines() if line.strip()]
    return f"it ended; its log ({log}) ends: {tail[-1][:200]}" if tail else f"it ended with an empty log ({log})"


def record(folder: Path, name: str, token: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / JOB_FILE).write_text(json.dumps({"name": name, "token": token}))


def cancel(folder: Path, name: str, token: str) -> None:
    """scancel the array (pending and running tasks) and wait until squeue no longer lists it."""
    from .processes import end_job

    slurm.cancel(name)
    slurm.wait_gone(name, limit=30)
    end_job(token, prefix=True)  # a task's strays on this machine (a cluster's cgroups end the rest)
    (folder / JOB_FILE).unlink(missing_ok=True)


def cancel_stale(lab_dir: Path) -> None:
    """The array of a run whose command was killed outright: cancel it before regrading its copies."""
    try:
        job = json.loads((lab_dir / "slurm" / JOB_FILE).read_text())
    except (OSError, ValueError):
        return
    cancel(lab_dir / "slurm", job["name"], job["token"])
