"""What the private cluster's controller records for parlab's requests, and what the job's cgroup holds.

One queued launch on 2 GPUs: ``scontrol show job`` of its own job, read
from inside rank 0, lists the CPUs and memory ``srun`` asked for (2 CPUs
and 4G per GPU by default), and the rank's memory cgroup carries that limit
(``task/cgroup``, ``ConstrainRAMSpace=yes``).  One grading array is
submitted held (``--hold``), so nothing of it runs: Slurm records its
throttle (``%2``), its memory per task and its reservation; then it is
cancelled.  Unit tests of the same arguments: tests/unit/test_slurm_requests.py.
"""
import subprocess

import pytest

import parlab
from parlab.classgrade import array_slurm

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(120)]


def own_job_and_memory_limit():
    import os
    import subprocess

    shown = subprocess.run(["scontrol", "show", "job", os.environ["SLURM_JOB_ID"]], capture_output=True,
                           text=True).stdout
    path = next(line.split(":", 2)[2].strip() for line in open("/proc/self/cgroup") if ":memory:" in line)
    job = path[:path.index("/job_")] + "/job_" + os.environ["SLURM_JOB_ID"]  # slurm_NODE/uid_U/job_ID
    with open(f"/sys/fs/cgroup/memory{job}/memory.limit_in_bytes") as f:
        return shown, int(f.read())


def test_a_launch_asks_cpus_and_memory_per_gpu_and_its_cgroup_holds_the_memory(monkeypatch):
    for name in ("PARLAB_SLURM_CPUS_PER_GPU", "PARLAB_SLURM_MEM_PER_GPU"):
        monkeypatch.delenv(name, raising=False)
    (shown, limit), _ = parlab.launch(own_job_and_memory_limit, nproc=2, scheduler="slurm", gpus=2, timeout=90)
    assert "NumCPUs=4 " in shown and "mem=8G" in shown, shown
    assert limit <= 8 * 2**30, limit  # the job's 8G, or the machine's memory if that is less


def test_grading_array_records_its_throttle_memory_and_reservation(tmp_path):
    name = "parlab-grade-asks"
    subprocess.run(["scontrol", "create", "reservation", "ReservationName=parlab-exam", "StartTime=now+1day",
                    "Duration=10", "Nodes=n1", "Users=root"], check=True, capture_output=True)
    try:
        req = array_slurm.check("gpu", None, None, 1, 3, 6, 1, mem="3G", throttle=2, reservation="parlab-exam")
        cmd = array_slurm.sbatch_command(req, name, 6, tmp_path, tmp_path, tmp_path / "plan.json")
        jobid = array_slurm.submit(cmd[:-2] + ["--hold"] + cmd[-2:])
        try:
            shown = subprocess.run(["scontrol", "show", "job", jobid], capture_output=True, text=True).stdout
        finally:
            subprocess.run(["scancel", jobid], check=False)
        assert "ArrayTaskId=0-5%2" in shown, shown
        assert "MinMemoryNode=3G" in shown and "Reservation=parlab-exam" in shown, shown
    finally:
        subprocess.run(["scontrol", "delete", "ReservationName=parlab-exam"], check=False, capture_output=True)
