"""One task of the Slurm array: ``python -m parlab.classgrade.task PLAN``.

Slurm starts it on a compute node with ``SLURM_ARRAY_TASK_ID`` set; it
grades the submissions of its chunk (``PLAN``'s ``tasks[ID]``) one after the
other, each exactly as a local worker does: the same worker process
(``worker``) in the same course copy, prepared by the submitting command,
in a session of its own, ended with all its processes when it finishes
(``processes``), and with the same ``--timeout``.  Before a worker starts,
``started.json`` in its copy says where (node, task, pid); when it ends,
``ended.json`` gives its exit status.  The worker's own ``result.json`` is
what the submitting command merges.  Nothing here writes to the course.

When Slurm ends the task (``scancel``, its time limit), it sends SIGTERM:
the task then ends the running worker and everything it started, and
exits; that submission and the rest of the chunk are graded again on the
next run.  The task is also a child subreaper, so a process a worker
detaches stays below it, where Slurm's own kill finds it.
"""
from __future__ import annotations

import ctypes
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from . import processes

STARTED, ENDED = "started.json", "ended.json"
_PR_SET_CHILD_SUBREAPER = 36


def _write(path: Path, data: dict) -> None:
    part = path.with_suffix(".part")
    part.write_text(json.dumps(data))
    os.replace(part, path)


def read(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _subreaper() -> None:
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
        except (OSError, AttributeError):
            pass


def _reap() -> None:
    """Collect the orphans that ended below this subreaper."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def grade_one(root: Path, lab: str, student: str, token: str, timeout: float | None, where: dict) -> None:
    proc, log = processes.spawn(root, lab, student, token)
    timed_out = False
    try:
        _write(root / STARTED, {**where, "pid": proc.pid, "time": time.time()})
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
    finally:  # also on SIGTERM from Slurm: nothing of this worker outlives the task
        processes.end_worker(proc, token)
        log.close()
        _reap()
    _write(root / ENDED, {"returncode": proc.returncode, "timed_out": timed_out})


def main(argv: list[str]) -> int:
    if len(argv) != 1 or "SLURM_ARRAY_TASK_ID" not in os.environ:
        print(__doc__.splitlines()[0] + " (run by sbatch --array, which sets SLURM_ARRAY_TASK_ID)", file=sys.stderr)
        return 2
    plan = json.loads(Path(argv[0]).read_text())
    index = int(os.environ["SLURM_ARRAY_TASK_ID"])
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    _subreaper()
    where = {"node": os.environ.get("SLURMD_NODENAME") or socket.gethostname(), "task": index,
             "job": os.environ.get("SLURM_ARRAY_JOB_ID", "")}
    for k, entry in enumerate(plan["tasks"][index]):
        print(f"task {index}: grading {entry['student']}", flush=True)
        grade_one(Path(entry["root"]), plan["lab"], entry["student"], f"{plan['token']}-{index}-{k}",
                  plan["timeout"], where)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
