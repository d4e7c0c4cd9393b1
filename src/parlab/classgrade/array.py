"""``parlab grade LAB --slurm``: the class graded as one Slurm array job, merged here by the one writer.

    parlab grade 00-setup --slurm --partition cpu --time-limit 30 --chunk 4

Before anything is queued, Slurm is probed and the request checked
(``array_slurm.check``).  This command then prepares every course copy
(as the local scheduler does, on the course's own filesystem, which the
compute nodes must share), writes the plan (which submissions each task
grades: ``--chunk`` of them, default 1) and queues one ``sbatch --array``
job whose task ``i`` runs ``python -m parlab.classgrade.task PLAN``
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
                         out=None, mem: str | None = None, throttle: int | None = None,
                         reservation: str | None = None, qos: str | None = None,
                         students: list[str] | None = None) -> Progress:
    from .run import widest_launch

    c, todo, progress = plan.select(root, lab, force, out, students)
    req = array_slurm.check(partition, account, time_limit, cpus_per_task, widest_launch(lab), len(todo), chunk,
                            mem, throttle, reservation, qos)
    tasks, cpus = math.ceil(len(todo) / chunk), req.cpus_per_task
    timeout = plan.submission_timeout(c, lab, timeout)
    plan.announce(c, lab, todo, progress, "(nothing to queue)" if not todo else
                  f"as a Slurm array of {tasks} task{'s' * (tasks != 1)} ({chunk} per task, "
                  f"{cpus} CPU{'s' * (cpus != 1)} and {req.mem_mb} MB each"
                  f"{f', at most {req.throttle} at once' if req.throttle else ''}, partition {req.partition})",
                  timeout)
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
        progress.note(f"Slurm job {jobid} ({name}): {len(chunks)} array task{'s' * (len(chunks) != 1)} "
                      f"queued, logs {folder}/task-N.log")
        _Watch(c, jobid, name, chunks, folder, req, timeout, progress).run()
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


class _Watch:
    """The submitting side's view of the array: each task from squeue, each submission from its copy."""

    def __init__(self, c, jobid: str, name: str, chunks: list, folder: Path, req, timeout, progress: Progress):
        self.c, self.jobid, self.name, self.folder, self.req = c, jobid, name, folder, req
        self.timeout, self.progress, self.tasks = timeout, progress, len(chunks)
        self.waiting = {sub.student: (i, sub) for i, ch in enumerate(chunks) for sub in ch}
        self.shown: dict[int, tuple] = {}
        self.absent = dict.fromkeys(range(len(chunks)), 0)
        self.squeue_failed = False

    def run(self) -> None:
        next_squeue = 0.0
        while self.waiting:
            time.sleep(POLL)
            if time.monotonic() >= next_squeue:
                next_squeue = time.monotonic() + SQUEUE_EVERY
                self.look_at_squeue()
            for student, (i, sub) in list(self.waiting.items()):
                if self.settle(i, sub):
                    del self.waiting[student]

    def look_at_squeue(self) -> None:
        states = array_slurm.task_states(self.name)
        if (states is None) != self.squeue_failed:
            self.squeue_failed = states is None
            self.progress.note("squeue does not answer; results are still merged as they come, Ctrl-C "
                               "cancels the array" if self.squeue_failed else "squeue answers again")
        for i in (range(self.tasks) if states is not None else ()):
            if i not in states:
                self.absent[i] += 1
            elif states[i] != self.shown.get(i):
                self.absent[i], self.shown[i] = 0, states[i]
                state, reason, node = states[i]
                self.progress.note(f"Slurm task {i}: {state.lower()}" + (f" on {node}" if node else "")
                                   + (f" ({reason})" if reason and reason != "None" else ""))
            else:
                self.absent[i] = 0

    def settle(self, i: int, sub) -> bool:
        """Merge or fail the submission once its worker or its task has ended; whether it is settled."""
        root, student = worker.copy_root(self.c, sub), sub.student
        got, ended = worker.result(root), read(root / ENDED)
        if got and got.get("ok"):
            plan.merge_one(self.c, root, sub, self.progress, got["seconds"])
        elif got or ended:
            timed_out = self.timeout if ended and ended.get("timed_out") else None
            self.progress.fail(student, worker.why_failed(root, (ended or {}).get("returncode"), timed_out))
        elif self.absent[i] >= GONE_AFTER:
            during = "while grading it" if (root / STARTED).exists() else "before it reached it"
            why = array_slurm.why_ended(self.folder / f"task-{i}.log", self.req.time_limit)
            self.progress.fail(student, f"Slurm task {i} of job {self.jobid} ended {during}: {why}; "
                               "it is graded again on the next run")
        else:
            if self.progress.state[student] == "queued" and (where := read(root / STARTED)):
                self.progress.set(student, "grading", f"task {i} of Slurm job {self.jobid} on {where['node']}, "
                                  f"worker pid {where['pid']}")
            return False
        return True
