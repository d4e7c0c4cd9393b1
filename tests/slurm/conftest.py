"""The slurm tier's cluster: a private slurmctld and two slurmd for the whole session.

scripts/slurm_local.py writes the configuration into a temporary folder and
starts munged, slurmctld and the slurmd of nodes n1 and n2 (partition ``gpu``
is n1 with its 8 dummy GPUs, partition ``two`` both nodes); the session ends
by stopping them by pid.  Launches use a private TMPDIR, so "nothing left"
means nothing of these tests, whatever else runs on the machine.
"""
from __future__ import annotations

import importlib.util
import os
import tempfile

import pytest
from slurm_helpers import launch_processes, parlab_jobs, wait_for

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _slurm_local():
    spec = importlib.util.spec_from_file_location("slurm_local", os.path.join(ROOT, "scripts", "slurm_local.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session", autouse=True)
def cluster(tmp_path_factory):
    if not any(os.path.exists(f"{d}/slurmctld") for d in ("/usr/sbin", "/usr/bin")):
        pytest.skip("slurm tier: Slurm is not installed")
    local = _slurm_local()
    where = str(tmp_path_factory.mktemp("slurm"))
    jobs = str(tmp_path_factory.mktemp("tmp"))
    saved = {k: os.environ.get(k) for k in ("SLURM_CONF", "TMPDIR", "PARLAB_SCHEDULER")}
    local.start(where, nodes=2)
    os.environ.update({"SLURM_CONF": os.path.join(where, "slurm.conf"), "TMPDIR": jobs})
    os.environ.pop("PARLAB_SCHEDULER", None)
    tempfile.tempdir = None  # gettempdir() reads TMPDIR again
    try:
        yield where
    finally:
        local.stop(where)
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        tempfile.tempdir = None


@pytest.fixture(autouse=True)
def nothing_left(cluster):
    yield
    assert wait_for("no jobs", lambda: not parlab_jobs(), 15), f"jobs left in squeue: {parlab_jobs()}"
    assert wait_for("no processes", lambda: not launch_processes(), 10), \
        f"launch processes left: {launch_processes()}"
