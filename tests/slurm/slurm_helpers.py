"""What the slurm tier asks of the machine: parlab jobs in squeue, launch processes, waiting."""
from __future__ import annotations

import os
import subprocess
import tempfile
import time

import psutil


def parlab_jobs() -> list[str]:
    out = subprocess.run(["squeue", "-h", "-o", "%i %j %T"], capture_output=True, text=True, check=True)
    return [line for line in out.stdout.splitlines() if " parlab-" in line]


def launch_processes() -> list[int]:
    """Processes of this session's launches (their PARLAB_JOB_DIR lies in the private TMPDIR)."""
    root = tempfile.gettempdir()
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.environ().get("PARLAB_JOB_DIR", "").startswith(root + os.sep):
                found.append(proc.pid)
        except (psutil.Error, OSError):
            continue
    return found


def wait_for(what, check, limit=20.0):
    deadline = time.monotonic() + limit
    while True:
        value = check()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(0.2)
