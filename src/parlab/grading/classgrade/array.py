"""``parlab grade LAB --slurm``: the class graded as one Slurm array job, merged here by the one writer.

    parlab grade 00-setup --slurm --partition cpu --time-limit 30 --chunk 4

Before anything is queued, Slurm is probed and the request checked
(``array_slurm.check``).  This command then prepares every course copy
(as the local scheduler does, on the course's own filesystem, which the
compute nodes must share), writes the plan (which submissions each task
grades: ``--chunk`` of them, default 1) and queues one ``sbatch --array``
job whose task ``i`` runs ``python -m parlab.grading.classgrade.task PLAN``
(``task``): the same worker, sandbox and per-submission gradebook as a
local run.

**Why the merge runs here, not as a dependent job.**  The gradebook must
have one writer, and this command already is one: it merges each
submission as soon as its task has graded it (the gradebook fills while
the array runs), shows each submission's state from squeue and the
copies' ``started.json``/``result.json``, prints the same summary table,
and can cancel the array when it is stopped.  A dependent merge job would
merge only after the last task, need a node and a time limit of its own,
leave its summary in a log file, and a merge job that failed would be a
failure nobody watches.  The cost: this command must stay alive while the
array runs (run it in tmux or screen on the login node; it only polls).
If it is killed outright the tasks go on; the next run cancels that array
(``array_slurm.cancel_stale``) and, with ``--resume``, merges what it
had graded.

Everything the local mode guarantees holds: a task that Slurm ends (scancel,
its time limit, its node) costs only its submissions, which are listed as
grader failures (never a 0) and graded again by the next run; Ctrl-C or
SIGTERM here cancels the array and waits until squeue no longer lists it.
"""
from __future__ import annotations

import contextlib
import json
import math
import secrets
import signal
import time
from pathlib import Path

from parlab.launch import slurm

from . import array_slurm, inputs, plan, worker
from .report import Progress
from .task import ENDED, STARTED, read

POLL = 0.5          # seconds between looks at the copies' files
SQUEUE_EVERY = 2.0  # seconds between squeue calls
GONE_AFTER = 2      # a task absent from this many squeue answers in a row has ended


def grade_class_on_slurm(root: Path, lab: str, partition: str | None = None, account: str | None = None,
                         time_limit: float | None = None, cpus_per_task: int | None = None, chunk: int = 1,
                         resume: bool = False, force: bool = False, timeout: float | None = None,
                         out=None) -> Progress:
    from .run import widest_launch

    c, todo, progress = plan.select(root, lab, force, out)
    req = array_slurm.check(partition, account, time_limit, cpus_per_task, widest_launch(lab), len(todo), chunk)
    tasks = math.ceil(len(todo) / chunk)
    plan.announce(c, lab, todo, progress,
                  f"as a Slurm array of {tasks} task{'s' * (tasks != 1)} ({chunk} per task, "
                  f"{req.cpus_per_task} CPUs each, partition {req.partition})")
    if not todo:
        return progress
    queue, template = plan.begin(c, lab, todo, progress, resume)
    if queue:
        _run_array(c, lab, queue, template, req, chunk, timeout, progress)
    return progress


def _run_array(c: inputs.Course, lab: str, queue: list, template: Path, req: array_slurm.ArrayRequest,
               chunk: int, timeout: float | None, progress: Progress) -> None:
    chunks = [queue[i:i + chunk] for i in range(0, len(queue), chunk)]
    folder = c.workdir / lab / "slurm"
    for old in folder.glob("task-*.log"):
        old.unlink()
    token = secrets.token_hex(6)
    name = f"parlab-grade-{lab}-{token}"
    plan_file = folder / "plan.json"
    folder.mkdir(parents=True, exist_ok=True)
    plan_file.write_text(json.dumps({"lab": lab, "token": token, "timeout": timeout, "tasks": [
        [{"root": str(worker.prepare(c, sub, template)), "student": sub.student} for sub in ch]
        for ch in chunks]}))
    array_slurm.record(folder, name, token)  # before sbatch: a kill in between still finds the job
    finished = False
    try:
        jobid = array_slurm.submit(array_slurm.sbatch_command(req, name, len(chunks), folder, c.root, plan_file))
        progress.note(f"Slurm job {jobid} ({name}): {len(chunks)} array tasks queued, logs {folder}/task-N.log")
        _watch(c, jobid, name, chunks, folder, req, timeout, progress)
        finished = True
        if not slurm.wait_gone(name, limit=30):
            finished = False  # the tasks should be ending; cancel what is left
    finally:
        if not finished:
            with _signals_held():  # a second Ctrl-C or SIGTERM must not cut the cancel short
                array_slurm.cancel(folder, name, token)
        (folder / array_slurm.JOB_FILE).unlink(missing_ok=True)


@contextlib.contextmanager
def _signals_held():
    saved = {s: signal.signal(s, signal.SIG_IGN) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, handler in saved.items():
            signal.signal(s, handler)


def _watch(c, jobid: str, name: str, chunks: list, folder: Path, req, timeout, progress: Progress) -> None:
    waiting = {sub.student: (i, sub) for i, ch in enumerate(chunks) for sub in ch}
    shown: dict[int, tuple] = {}
    absent = dict.fromkeys(range(len(chunks)), 0)
    next_squeue = 0.0
    while waiting:
        time.sleep(POLL)
        if time.monotonic() >= next_squeue:
            next_squeue = time.monotonic() + SQUEUE_EVERY
            states = array_slurm.task_states(name)
            for i in (range(len(chunks)) if states is not None else ()):
                if i in states:
                    absent[i] = 0
                    if states[i] != shown.get(i):
                        shown[i] = states[i]
                        state, reason, node = states[i]
                        progress.note(f"Slurm task {i}: {state.lower()}" + (f" on {node}" if node else "")
                                      + (f" ({reason})" if reason and reason != "None" else ""))
                else:
                    absent[i] += 1
        for student, (i, sub) in list(waiting.items()):
            root = worker.copy_root(c, sub)
            got, ended = worker.result(root), read(root / ENDED)
            if got and got.get("ok"):
                plan.merge_one(c, root, sub, progress, got["seconds"])
            elif got or ended:
                timed_out = timeout if ended and ended.get("timed_out") else None
                progress.fail(student, worker.why_failed(root, (ended or {}).get("returncode"), timed_out))
            elif absent[i] >= GONE_AFTER:
                during = "while grading it" if (root / STARTED).exists() else "before it reached it"
                progress.fail(student, f"Slurm task {i} of job {jobid} ended {during}: "
                              f"{array_slurm.why_ended(folder / f'task-{i}.log', req.time_limit)}; "
                              "it is graded again on the next run")
            else:
                if progress.state[student] == "queued" and (where := read(root / STARTED)):
                    progress.set(student, "grading", f"task {i} of Slurm job {jobid} on {where['node']}, "
                                 f"worker pid {where['pid']}")
                continue
            del waiting[student]
