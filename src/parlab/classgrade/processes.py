"""A worker's processes: started in a session of their own, ended together, orphans included.

Every process of one worker (nbgrader, its kernel, the sandbox, the ranks)
inherits ``PARLAB_GRADE_JOB`` with the worker's own token, so whoever
started the worker (the local scheduler, or an array task on a Slurm node)
can end them all, even those that left the worker's session: a Jupyter
kernel runs in a process group of its own and the sandbox in a session of
its own.
"""
from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

from ..grading import boundary
from . import worker

JOB_VAR = "PARLAB_GRADE_JOB"


def spawn(root: Path, lab: str, student: str, token: str):
    """Start the worker for the course copy at ``root``; returns (process, its open log file)."""
    log = open(root / worker.LOG, "w")
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"), **{JOB_VAR: token})
    proc = subprocess.Popen(worker.command(root, lab, student), cwd=root, env=env, stdin=subprocess.DEVNULL,
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    return proc, log


def end_job(token: str, prefix: bool = False) -> int:
    """SIGKILL every process whose token is ``token`` (or, with ``prefix``, starts with it); how many."""
    import psutil

    ended = 0
    for p in psutil.process_iter():
        try:
            if p.pid == os.getpid():
                continue
            got = p.environ().get(JOB_VAR)
            if got is not None and (got.startswith(token) if prefix else got == token):
                p.kill()
                ended += 1
        except (psutil.Error, OSError):
            continue
    return ended


def end_worker(proc: subprocess.Popen, token: str) -> None:
    """End the worker's session and every process that carries its token, then reap the worker."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    end_job(token)
    proc.wait()
    boundary.remove_stale_cgroups()  # the worker's boxes' cgroups, if it was killed before it closed them
