"""The scheduler behind ``parlab grade LAB``: N workers, one writer, resumable.

    parlab grade 00-setup                 # every submission not graded yet, or changed since
    parlab grade 00-setup --workers 4
    parlab grade 00-setup --resume        # also merge copies a stopped run graded but did not merge
    parlab grade 00-setup --force         # regrade everything

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

import argparse
import importlib
import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path

from . import inputs, merge, worker
from .report import Progress

POLL = 0.2
#: Every process of one worker (nbgrader, its kernel, the sandbox, the ranks) inherits this
#: variable with the job's own value, so the scheduler can end them all, orphans included.
JOB_VAR = "PARLAB_GRADE_JOB"


def widest_launch(lab: str) -> int:
    """The largest world size among the lab's checks (``lab00`` for ``00-setup``)."""
    try:
        module = importlib.import_module(f"parlab.grading.lab{lab[:2]}")
    except ImportError:
        return 4
    sizes = [n for obj in vars(module).values() if (ex := getattr(obj, "exercise", None)) is not None
             for n, _ in (*ex.visible, *ex.hidden)]
    return max(sizes, default=4)


def default_workers(lab: str) -> int:
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, cores // widest_launch(lab))


def end_job(token: str) -> int:
    """SIGKILL every process whose environment carries this job's token; how many."""
    import psutil

    ended = 0
    for p in psutil.process_iter():
        try:
            if p.pid != os.getpid() and p.environ().get(JOB_VAR) == token:
                p.kill()
                ended += 1
        except (psutil.Error, OSError):
            continue
    return ended


def end_stale_jobs(c: inputs.Course, lab: str) -> None:
    """Workers of a scheduler that was killed outright may still run: end them first."""
    for job in (c.workdir / lab).glob("*/job"):
        end_job(job.read_text().strip())
        job.unlink(missing_ok=True)


class Running:
    def __init__(self, sub: inputs.Submission, root: Path, proc: subprocess.Popen, log, token: str):
        self.sub, self.root, self.proc, self.log, self.token = sub, root, proc, log, token
        self.start = time.monotonic()
        (root / "worker.pid").write_text(str(proc.pid))
        (root / "job").write_text(token)

    def end_group(self) -> None:
        """End whatever the worker left: its session, and every process that carries its token.

        (A Jupyter kernel runs in a process group of its own and the sandbox in
        a session of its own, so the worker's session alone does not hold them.)
        """
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        end_job(self.token)
        (self.root / "job").unlink(missing_ok=True)
        self.log.close()


def _start(c: inputs.Course, sub: inputs.Submission, template: Path) -> Running:
    root = worker.prepare(c, sub, template)
    log = open(root / worker.LOG, "w")
    token = secrets.token_hex(8)
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"), **{JOB_VAR: token})
    proc = subprocess.Popen(worker.command(root, sub), cwd=root, env=env, stdin=subprocess.DEVNULL,
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    return Running(sub, root, proc, log, token)


def _why_failed(job: Running, timed_out: float | None) -> str:
    if timed_out:
        return f"grading took longer than {timed_out:g} s and was stopped (--timeout)"
    got = worker.result(job.root)
    if got is None:
        code = job.proc.returncode
        how = f"killed by signal {-code}" if code is not None and code < 0 else f"exit code {code}"
        return f"the worker died ({how}) before it finished; it is graded again on the next run"
    tail = worker.log_tail(job.root, 400).strip().splitlines()
    return f"nbgrader could not grade it: {got.get('error', '?')}" + (f" | log: {tail[-1]}" if tail else "")


def _resumable(c: inputs.Course, sub: inputs.Submission) -> Path | None:
    """A copy of this very hand-in that a stopped run graded but did not merge."""
    root = worker.copy_root(c, sub)
    got = worker.result(root)
    try:
        same = (root / "digest").read_text() == sub.digest
    except OSError:
        same = False
    return root if same and got and got.get("ok") else None


def grade_class(root: Path, lab: str, workers: int | None = None, resume: bool = False,
                force: bool = False, timeout: float | None = None, out=None) -> Progress:
    c = inputs.course(root)
    a = inputs.assignment(c, lab)
    subs, rejected = inputs.find(c, a)
    todo = [s for s in subs if force or not merge.up_to_date(c, s)]
    progress = Progress(lab, [s.student for s in todo], out)
    progress.rejected = {r.student: r.reason for r in rejected}
    progress.skipped = [s.student for s in subs if s not in todo]
    progress.absent = inputs.absent(a, subs, rejected)
    n = workers or default_workers(lab)
    print(f"parlab grade {lab}: {len(todo)} to grade with {n} worker{'s' * (n != 1)}, "
          f"{len(progress.skipped)} unchanged, {len(rejected)} rejected (work dir {c.workdir})",
          file=progress.out, flush=True)
    for student, why in sorted(progress.rejected.items()):
        print(f"          {student:<16} rejected {why}", file=progress.out, flush=True)
    if not todo:
        return progress
    end_stale_jobs(c, lab)
    template = c.workdir / lab / "gradebook-template.db"
    worker.snapshot_gradebook(c, template)
    queue, running = list(todo), []
    if resume:
        for sub in list(queue):
            if (copy := _resumable(c, sub)) is not None:
                queue.remove(sub)
                _merge_one(c, copy, sub, progress, worker.result(copy)["seconds"])
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
                job.proc.wait()
                got = worker.result(job.root)
                if got and got.get("ok") and not late:
                    _merge_one(c, job.root, job.sub, progress, got["seconds"])
                else:
                    progress.fail(job.sub.student, _why_failed(job, timeout if late else None))
    finally:
        for job in running:  # stopped (Ctrl-C, SIGTERM): end every worker; a rerun regrades them
            job.end_group()
    return progress


def _merge_one(c, copy: Path, sub, progress: Progress, seconds: float) -> None:
    try:
        progress.done(sub.student, merge.merge(c, copy, sub), seconds)
    except Exception as exc:  # noqa: BLE001 - one submission's merge must not stop the others
        progress.fail(sub.student, f"merging into the gradebook failed: {type(exc).__name__}: {exc}")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="parlab grade", description=__doc__.splitlines()[0])
    parser.add_argument("lab", help="the assignment, e.g. 00-setup")
    parser.add_argument("--workers", type=int, default=None,
                        help="submissions graded at once (default: cores // the lab's widest launch)")
    parser.add_argument("--resume", action="store_true",
                        help="merge what a stopped run graded but did not merge, instead of regrading it")
    parser.add_argument("--force", action="store_true", help="regrade every submission")
    parser.add_argument("--timeout", type=float, default=None, help="seconds one submission may take")
    parser.add_argument("--root", type=Path, default=Path.cwd(), help="course root (default: here)")
    args = parser.parse_args(argv)
    if args.workers is not None and args.workers < 1:
        parser.error("--workers must be at least 1")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so the workers are ended too
    try:
        progress = grade_class(args.root, args.lab, args.workers, args.resume, args.force, args.timeout)
    except inputs.CourseError as exc:
        print(f"parlab grade: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("\nparlab grade: stopped; run it again (with --resume) to go on", file=sys.stderr)
        return 130
    print(progress.summary(), flush=True)
    return 1 if progress.failed else 0
