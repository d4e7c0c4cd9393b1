"""The limits of the hub's servers, as asked of the kernel: cgroup files (v1 and v2) and systemd properties.

The cgroup v1 path runs for real in the hub tier (tests/hub: a student's CPU set, memory, pids and
devices cgroups).  The v2 path (a subtree delegated to the hub) is run here against a fake cgroup2 tree
(a folder with its control files): which files get what, in which order.  systemd is not on the
test machine: the unit properties SystemdSpawner is given are checked here, and that systemd
enforces them is what ``parlab preflight`` shows on the host.
"""
from __future__ import annotations

import asyncio
import runpy
import sys
import types
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "hub"))
cs = pytest.importorskip("course_spawner", reason="the hub kit needs jupyterhub (pip install -e '.[hub]')")


class RecordingCgroups(cs.ServerCgroups):
    """ServerCgroups that also records each write (a fake tree's files are plain files)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.writes: list[tuple[str, str]] = []

    def _write(self, path, text):
        self.writes.append((str(path.relative_to(self.root)), text))
        super()._write(path, text)


def _cgroup2_tree(tmp_path: Path, own: str, controllers: str = "cpuset cpu io memory hugetlb pids rdma",
                  procs: str = "4242\n4243\n") -> Path:
    base = tmp_path / own.strip("/")
    base.mkdir(parents=True)
    (base / "cgroup.controllers").write_text(controllers + "\n")
    (base / "cgroup.procs").write_text(procs)
    (base / "cgroup.subtree_control").write_text("")
    return base


def test_cgroup2_delegated_subtree(tmp_path):
    own = "/system.slice/jupyterhub.service"
    base = _cgroup2_tree(tmp_path, own)
    cg = RecordingCgroups("ada", 3 * 2**30, cpus=[4, 5, 6], tasks_max=2048, root=tmp_path, own_cgroup=own)
    assert not cg.v1 and not cg.closes_devices
    cg.create()
    svc = "system.slice/jupyterhub.service"
    assert cg.writes == [
        # the hub's own processes leave the delegated cgroup for a leaf: a cgroup with children holds none
        (f"{svc}/parlab-hub/cgroup.procs", "4242"), (f"{svc}/parlab-hub/cgroup.procs", "4243"),
        (f"{svc}/cgroup.subtree_control", "+cpuset +memory +pids"),
        (f"{svc}/parlab-servers/cgroup.subtree_control", "+cpuset +memory +pids"),
        (f"{svc}/parlab-servers/ada/cpuset.cpus", "4-6"),
        (f"{svc}/parlab-servers/ada/memory.max", str(3 * 2**30)),
        (f"{svc}/parlab-servers/ada/pids.max", "2048"),
    ]
    assert cg.path == base / "parlab-servers" / "ada"
    # once the hub lives in the leaf, its /proc/self/cgroup names the leaf: the same servers' folder
    later = cs.ServerCgroups("ada", root=tmp_path, own_cgroup=own + "/parlab-hub")
    assert later.path == cg.path and later.paths == {"unified": cg.path}
    (cg.path / "cgroup.procs").write_text("77\n78\n")
    assert later.pids() == [77, 78]


def test_cgroup2_without_delegation_or_without_a_limit(tmp_path):
    own = "/user.slice"
    _cgroup2_tree(tmp_path, own, controllers="memory pids")  # no cpuset handed down: not delegated
    with pytest.raises(RuntimeError, match="no cpuset controller.*Delegate=yes"):
        cs.ServerCgroups("bo", None, cpus=[0], tasks_max=10, root=tmp_path, own_cgroup=own).create()
    # the root of a tree without systemd: no leaf to move into, servers under /parlab-servers
    root = tmp_path / "root"
    _cgroup2_tree(root, "/")
    cg = RecordingCgroups("bo", None, cpus=[1], tasks_max=None, root=root, own_cgroup="/")
    cg.create()
    assert cg.writes[0] == ("cgroup.subtree_control", "+cpuset +memory +pids")
    assert ("parlab-servers/bo/memory.max", "max") in cg.writes and ("parlab-servers/bo/pids.max", "max") in cg.writes


def _cgroup1_tree(tmp_path: Path) -> Path:
    for controller in cs.ServerCgroups.V1_CONTROLLERS:
        (tmp_path / controller).mkdir(parents=True)
    (tmp_path / "memory" / "memory.limit_in_bytes").write_text("9223372036854771712\n")
    (tmp_path / "cpuset" / "cpuset.cpus").write_text("0-7\n")
    (tmp_path / "cpuset" / "cpuset.mems").write_text("0\n")
    return tmp_path


def test_cgroup1_cpuset_memory_pids_and_the_nvidia_majors(tmp_path):
    root = _cgroup1_tree(tmp_path / "cg")
    proc_devices = tmp_path / "devices"
    proc_devices.write_text("Character devices:\n  1 mem\n195 nvidia-frontend\n234 nvidia-uvm\n"
                            "237 nvidia-caps\n254 ndctl\n\nBlock devices:\n  7 loop\n")
    parent = root / "cpuset" / "parlab-hub"
    parent.mkdir()
    for name in ("cpuset.cpus", "cpuset.mems"):  # a new v1 cpuset: empty files
        (parent / name).write_text("")
    cg = RecordingCgroups("ada", 2**30, cpus=[2, 3], tasks_max=512, root=root, proc_devices=str(proc_devices),
                          dev=tmp_path / "no-dev")
    assert cg.v1 and cg.closes_devices
    cg.create()
    assert cg.writes == [
        ("cpuset/parlab-hub/cpuset.cpus", "0-7"), ("cpuset/parlab-hub/cpuset.mems", "0"),
        ("cpuset/parlab-hub/ada/cpuset.mems", "0"), ("cpuset/parlab-hub/ada/cpuset.cpus", "2-3"),
        ("memory/parlab-hub/ada/memory.limit_in_bytes", str(2**30)),
        ("pids/parlab-hub/ada/pids.max", "512"),
        ("devices/parlab-hub/ada/devices.deny", "c 195:* rwm"),
        ("devices/parlab-hub/ada/devices.deny", "c 234:* rwm"),
        ("devices/parlab-hub/ada/devices.deny", "c 237:* rwm"),
    ]
    # the memory cgroup is made without a limit too (what is left of a stopped server is ended from it)
    cg = RecordingCgroups("bo", None, cpus=[0], tasks_max=None, root=root, proc_devices=str(proc_devices),
                          dev=tmp_path / "no-dev")
    cg.create()
    assert ("memory/parlab-hub/bo/memory.limit_in_bytes", "-1") in cg.writes
    assert ("pids/parlab-hub/bo/pids.max", "max") in cg.writes


def test_cpu_lists_and_the_class_block():
    assert cs.cpu_list([7, 0, 1, 2, 5, 8]) == "0-2,5,7-8" and cs.parse_cpu_list("0-2,5,7-8") == [0, 1, 2, 5, 7, 8]
    assert cs.class_cpu_block(224, 31, None) == 7   # a DGX H100's 224 CPUs, 30 students and an instructor
    assert cs.class_cpu_block(2, 3, "") == 1        # never 0: one core each, shared round robin
    assert cs.class_cpu_block(224, 1, "0") == 0     # one user may have every core
    with pytest.raises(ValueError, match="PARLAB_HUB_CPUS_PER_SERVER=0 gives each of the 31 users' servers all 224"):
        cs.class_cpu_block(224, 31, "0")
    assert cs.cpu_block(31, 7, list(range(224))) == list(range(217, 224))


def _config(monkeypatch, tmp_path, **env):
    from traitlets.config import Config

    monkeypatch.setenv("PARLAB_HUB_STATE", str(tmp_path / "state"))
    for key in ("PARLAB_HUB_CPUS_PER_SERVER", "PARLAB_HUB_MEM_LIMIT", "PARLAB_HUB_SPAWNER", "PARLAB_HUB_CLASS_SIZE"):
        monkeypatch.delenv(key, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    config = Config()
    runpy.run_path(str(REPO / "hub" / "jupyterhub_config.py"), init_globals={"get_config": lambda: config})
    return config


def test_the_hub_config_blocks_cpus_and_limits_memory_by_default(monkeypatch, tmp_path):
    cores = len(__import__("os").sched_getaffinity(0))
    config = _config(monkeypatch, tmp_path, PARLAB_HUB_INSTRUCTORS="t", PARLAB_HUB_STUDENTS="a,b",
                     PARLAB_HUB_CLASS_SIZE="31")
    assert config.JupyterHub.spawner_class is cs.CourseSpawner
    assert config.CourseSpawner.cpus_per_server == max(1, cores // 31)
    assert config.Spawner.mem_limit == "4G" and config.CourseSpawner.tasks_max == 2048
    assert "mem_limit" not in _config(monkeypatch, tmp_path, PARLAB_HUB_MEM_LIMIT="none").Spawner
    with pytest.raises(ValueError, match="PARLAB_HUB_CPUS_PER_SERVER=0"):
        _config(monkeypatch, tmp_path, PARLAB_HUB_STUDENTS="a,b", PARLAB_HUB_CPUS_PER_SERVER="0")


def test_systemd_units_ask_for_the_same_limits(monkeypatch, tmp_path):
    """PARLAB_HUB_SPAWNER=systemd: SystemdSpawner's unit gets the block, memory, tasks and closed devices.

    jupyterhub-systemdspawner is not installed here and systemd-run cannot run: a stand-in module
    records what its ``start`` would hand systemd-run (its ``unit_extra_properties`` go last, over
    its own, as SystemdSpawner.start does).  Tested by preflight on the host.
    """
    from jupyterhub.spawner import Spawner
    from traitlets import Dict

    recorded = {}

    class StandInSystemdSpawner(Spawner):
        unit_extra_properties = Dict(config=True)

        async def start(self):
            recorded.update(cmd=list(self.cmd), env=self.get_env(), properties=dict(self.unit_extra_properties))
            return ("127.0.0.1", 1)

        async def stop(self, now=False):
            pass

        async def poll(self):
            return None

    monkeypatch.setitem(sys.modules, "systemdspawner", types.SimpleNamespace(SystemdSpawner=StandInSystemdSpawner))
    config = _config(monkeypatch, tmp_path, PARLAB_HUB_SPAWNER="systemd", PARLAB_HUB_INSTRUCTORS="t",
                     PARLAB_HUB_STUDENTS="a", PARLAB_HUB_CLASS_SIZE="1", PARLAB_HUB_CPUS_PER_SERVER="1",
                     PARLAB_HUB_MEM_LIMIT="3G")
    cls = config.JupyterHub.spawner_class
    assert issubclass(cls, StandInSystemdSpawner) and cls.__name__ == "CourseSystemdSpawner"
    config[cls.__name__].unit_extra_properties = {"CPUWeight": "50"}  # a site's own property is kept
    user = types.SimpleNamespace(name="a", id=3, url="/user/a/", escaped_name="a", server=None)
    spawner = cls(user=user, config=config, hub=types.SimpleNamespace(api_url="http://127.0.0.1:8081/hub/api",
                                                                      base_url="/hub/", url="", public_host=""))
    cores = sorted(__import__("os").sched_getaffinity(0))
    for _ in range(2):  # a restart asks the same
        asyncio.run(spawner.start())
        assert recorded["properties"] == {
            "AllowedCPUs": cs.cpu_list(cs.cpu_block(3, 1, cores)), "TasksMax": "2048", "DevicePolicy": "closed",
            "DeviceAllow": ["/dev/ptmx rw", "char-pts rw"], "MemoryAccounting": "yes",
            "MemoryMax": str(3 * 2**30), "CPUWeight": "50"}
    assert recorded["cmd"] == [str(Path(sys.executable).parent / "jupyterhub-singleuser")]
    env = recorded["env"]
    assert env["CUDA_VISIBLE_DEVICES"] == "" and env["JUPYTER_CONFIG_PATH"] == str(REPO / "hub" / "student")
