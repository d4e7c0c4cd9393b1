"""The local scheduler behind ``parlab grade LAB``: N workers on this machine, one writer, resumable.

    parlab grade 00-setup                 # every submission not graded yet, or changed since
    parlab grade 00-setup --workers 4
    parlab grade 00-setup --resume        # also merge copies a stopped run graded but did not merge
    parlab grade 00-setup --force         # regrade everything
    parlab grade 00-setup --student ada   # regrade ada's submission only, even if unchanged

Each submission is graded by a worker process of its own (``worker``), in
its own session, so that it, its kernel and its sandbox's ranks end
together.  The scheduler itself never runs a student's code; it starts the
workers, and merges each finished copy into the course (``merge``) while
the others go on.  A worker that dies or fails costs only its submission:
it is listed under "failed to grade", gets no score, and is graded again on
the next run.  A submission is regraded when it has no merged grade, its
files changed since that grade, or its ``autograded/`` folder is gone.

**Default worker count**: the usable cores divided by the most ranks that
one of the lab's checks starts at once (its largest world size), at least 1.
The sandbox runs one launch at a time, so that many ranks is what one
submission keeps busy while it is graded; the kernel mostly waits meanwhile.
"""
from __future__ import annotations

import importlib
import secrets
import subprocess
import time
from pathlib import Path

from ..cores import usable_cores
from . import inputs, plan, processes, worker
from .report import Progress

POLL = 0.2


def widest_launch(lab: str) -> int:
    """The largest world size among the lab's checks (``lab00`` for ``00-setup``)."""
    try:
        module = importlib.import_module(f"parlab.grading.lab{lab[:2]}")
    except ImportError:
        return 4
    from ..grading.harness import Exercise

    sizes = [n for obj in vars(module).values() if isinstance(ex := getattr(obj, "exercise", None), Exercise)
             for n, _ in (*ex.visible, *ex.hidden)]
    return max(sizes, default=4)


def default_workers(lab: str) -> int:
    return max(1, usable_cores() // widest_launch(lab))


class Running:
    def __init__(self, sub: inputs.Submission, root: Path, proc: subprocess.Popen, log, token: str):
        self.sub, self.root, self.proc, self.log, self.token = sub, root, proc, log, token
        self.start = time.monotonic()
        (root / "worker.pid").write_text(str(proc.pid))
        (root / "job").write_text(token)

    def end_group(self) -> None:
        """End whatever the worker left (``processes.end_worker``)."""
        processes.end_worker(self.proc, self.token)
        (self.root / "job").unlink(missing_ok=True)
        self.log.close()


def _start(c: inputs.Course, sub: inputs.Submission, template: Path) -> Running:
    root = worker.prepare(c, sub, template)
    token = secrets.token_hex(8)
    proc, log = processes.spawn(root, sub.lab, sub.student, token)
    return Running(sub, root, proc, log, token)


def grade_class(root: Path, lab: str, workers: int | None = None, resume: bool = False,
                force: bool = False, timeout: float | None = None, out=None,
                students: list[str] | None = None) -> Progress:
    c, todo, progress = plan.select(root, lab, force, out, students)
    n = workers or default_workers(lab)
    timeout = plan.submission_timeout(c, lab, timeout)
    plan.announce(c, lab, todo, progress, f"with {n} worker{'s' * (n != 1)}", timeout)
    if not todo:
        return progress
    queue, template = plan.begin(c, lab, todo, progress, resume)
    running: list[Running] = []
    try:
        while queue or running:
            while queue and len(running) < n:
                sub = queue.pop(0)
                running.append(_start(c, sub, template))
                progress.set(sub.student, "grading", f"worker pid {running[-1].proc.pid}")
            time.sleep(POLL)
            for job in list(running):
                late = timeout and time.monotonic() - job.start > timeout
                if job.proc.poll() is None and not late:
                    continue
                running.remove(job)
                job.end_group()
                got = worker.result(job.root)
                if got and got.get("ok") and not late:
                    plan.merge_one(c, job.root, job.sub, progress, got["seconds"])
                else:
                    progress.fail(job.sub.student, worker.why_failed(job.root, job.proc.returncode,
                                                                     timeout if late else None))
    finally:
        for job in running:  # stopped (Ctrl-C, SIGTERM): end every worker; a rerun regrades them
            job.end_group()
    return progress
