"""parlab.cores on fake cgroup trees: a CPU quota caps the core count, wherever the cgroup sits.

Each case writes a fake ``/proc/self`` (``cgroup`` and ``mountinfo``) and the
cgroup files it points at under tmp_path, so nothing depends on this
machine's own cgroups.  The last test shows the launcher's OMP_NUM_THREADS,
``parlab grade``'s worker count and the doctor's line all follow the quota.
"""
import os
from types import SimpleNamespace

import pytest

from parlab import cores

pytestmark = pytest.mark.unit


def fake_proc(tmp_path, memberships: list[str], mounts: list[tuple[str, str, str, str]]) -> str:
    """A /proc/self with ``memberships`` (lines of /proc/self/cgroup) and cgroup ``mounts``.

    A mount is (cgroup path it shows, mount point under tmp_path, fstype, super options).
    """
    proc = tmp_path / "proc"
    proc.mkdir()
    (proc / "cgroup").write_text("".join(line + "\n" for line in memberships))
    lines = [f"3{i} 23 0:2{i} {root} {tmp_path / point} rw,relatime - {kind} {kind} {opts}"
             for i, (root, point, kind, opts) in enumerate(mounts)]
    (proc / "mountinfo").write_text("25 1 8:1 / / rw - ext4 /dev/sda1 rw\n" + "\n".join(lines) + "\n")
    return str(proc)


def write(tmp_path, folder: str, **files: str) -> None:
    os.makedirs(tmp_path / folder, exist_ok=True)
    for name, text in files.items():
        (tmp_path / folder / name.replace("__", ".")).write_text(text + "\n")


@pytest.fixture
def many_cores(monkeypatch):
    monkeypatch.setattr(cores, "affinity_cores", lambda: 112)  # a DGX's affinity, whatever runs this


def test_v2_quota_in_a_container_is_rounded_up(tmp_path, many_cores):
    proc = fake_proc(tmp_path, ["0::/"], [("/", "cg", "cgroup2", "rw")])
    write(tmp_path, "cg", cpu__max="150000 100000")
    assert cores.cpu_quota(proc) == 1.5
    assert cores.usable_cores(proc) == 2
    assert cores.cores_text(proc) == "2 (a cgroup CPU quota of 1.5 CPUs; 112 cores in this process's affinity)"


def test_v2_limit_of_an_ancestor_applies_and_the_smallest_wins(tmp_path, many_cores):
    proc = fake_proc(tmp_path, ["0::/user.slice/user-1000.slice/jupyter-ann.service"],
                     [("/", "cg", "cgroup2", "rw,nsdelegate")])
    write(tmp_path, "cg/user.slice", cpu__max="800000 100000")
    write(tmp_path, "cg/user.slice/user-1000.slice", cpu__max="400000 100000")
    write(tmp_path, "cg/user.slice/user-1000.slice/jupyter-ann.service", cpu__max="max 100000")
    assert cores.cpu_quota(proc) == 4.0 and cores.usable_cores(proc) == 4


def test_v1_quota_seen_through_a_mount_of_the_containers_own_cgroup(tmp_path, many_cores):
    # Docker without a cgroup namespace: /proc/self/cgroup names /docker/abc, and that is what is mounted.
    proc = fake_proc(tmp_path, ["5:memory:/docker/abc", "4:cpu,cpuacct:/docker/abc", "0::/"],
                     [("/docker/abc", "cpu,cpuacct", "cgroup", "rw,cpu,cpuacct"),
                      ("/docker/abc", "memory", "cgroup", "rw,memory")])
    write(tmp_path, "cpu,cpuacct", cpu__cfs_quota_us="300000", cpu__cfs_period_us="100000")
    assert cores.cpu_quota(proc) == 3.0 and cores.usable_cores(proc) == 3


def test_hybrid_hierarchy_takes_the_tighter_of_v1_and_v2(tmp_path, many_cores):
    proc = fake_proc(tmp_path, ["1:cpu:/", "0::/"],
                     [("/", "cpu", "cgroup", "rw,cpu"), ("/", "unified", "cgroup2", "rw")])
    write(tmp_path, "cpu", cpu__cfs_quota_us="600000", cpu__cfs_period_us="100000")
    write(tmp_path, "unified", cpu__max="250000 100000")
    assert cores.cpu_quota(proc) == 2.5 and cores.usable_cores(proc) == 3


@pytest.mark.parametrize("files", [dict(cpu__cfs_quota_us="-1", cpu__cfs_period_us="100000"),
                                   dict(cpu__cfs_quota_us="garbage", cpu__cfs_period_us="100000"),
                                   dict()])
def test_no_quota_or_unreadable_files_leave_the_affinity(tmp_path, many_cores, files):
    proc = fake_proc(tmp_path, ["1:cpu:/"], [("/", "cpu", "cgroup", "rw,cpu")])
    write(tmp_path, "cpu", **files)
    assert cores.cpu_quota(proc) is None
    assert cores.usable_cores(proc) == 112 and cores.cores_text(proc) == "112"


def test_a_quota_above_the_affinity_changes_nothing_and_no_proc_means_no_quota(tmp_path, monkeypatch):
    monkeypatch.setattr(cores, "affinity_cores", lambda: 2)
    proc = fake_proc(tmp_path, ["0::/"], [("/", "cg", "cgroup2", "rw")])
    write(tmp_path, "cg", cpu__max="800000 100000")
    assert cores.usable_cores(proc) == 2 and cores.cores_text(proc) == "2"
    assert cores.cpu_quota(str(tmp_path / "absent")) is None


def test_launcher_grader_and_doctor_all_count_the_quota(monkeypatch):
    """A 4-CPU quota on 112 cores: 2 threads per rank of 2, 1 grading worker per 4-rank lab."""
    from parlab import doctor
    from parlab.classgrade import run
    from parlab.launch.job import Job

    monkeypatch.setattr(cores, "affinity_cores", lambda: 112)
    monkeypatch.setattr(cores, "cpu_quota", lambda proc_dir="/proc/self": 4.0)
    job = Job.__new__(Job)
    job.nproc, job.backend, job.debug, job.extra_env = 2, "gloo", False, {}
    job.job = SimpleNamespace(path="/nonexistent/job", tmp="/nonexistent/tmp")
    assert job._env()["OMP_NUM_THREADS"] == "2"
    monkeypatch.setattr(run, "widest_launch", lambda lab: 4)
    assert run.default_workers("00-setup") == 1
    assert doctor.cores_text().startswith("4 (a cgroup CPU quota of 4 CPUs")
