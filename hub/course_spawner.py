"""The single-user servers of the course hub: local processes, in the parlab environment.

``CourseSpawner`` is JupyterHub's ``LocalProcessSpawner`` (each server runs
as the student's own Unix user) plus what a shared GPU host needs:

- the server runs ``jupyterhub-singleuser`` of the hub's own Python, the
  parlab environment, so the ``python3`` kernel that every lab names
  (``metadata.kernelspec.name``) is that environment, for students and for
  nbgrader's autograde alike (jupyter_client starts a ``python``/``python3``
  kernel with the server's own ``sys.executable``);
- ``CUDA_VISIBLE_DEVICES=""``: the server and its launches see no GPU (on one
  box every server would otherwise see all 8 and each launch would put ranks
  on GPUs 0..3 of everyone);
- its own CPU set (``cpus_per_server`` cores, a block chosen from the user's
  id), applied with ``sched_setaffinity`` before the server starts, which
  parlab counts when it divides cores among ranks;
- a memory limit (``mem_limit``) enforced by a memory cgroup of its own
  (``/sys/fs/cgroup/memory/parlab-hub/<user>`` on cgroup v1, or
  ``/sys/fs/cgroup/parlab-hub/<user>`` on v2); a limit that cannot be applied
  refuses the spawn with the reason instead of running unlimited;
- ``JUPYTER_CONFIG_PATH`` pointing at ``hub/student`` or ``hub/instructor``:
  nbgrader's exchange, Validate's cell timeout, and which nbgrader
  extensions each side gets.

LocalProcessSpawner cannot hide device files: a student who sets
``CUDA_VISIBLE_DEVICES`` back in a terminal sees the GPUs again.
SystemdSpawner (``DevicePolicy``) and containers (device requests) can;
docs/jupyterhub.md has those variants.
"""
from __future__ import annotations

import asyncio
import errno
import os
import signal
import sys
from pathlib import Path

from jupyterhub.spawner import LocalProcessSpawner
from traitlets import Int, List, Unicode

HUB_DIR = Path(__file__).resolve().parent
CGROUP_ROOT = Path("/sys/fs/cgroup")


def kill_pids(pids) -> None:
    """SIGKILL each pid that is still there."""
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def cpu_block(user_id: int, per_server: int, cores: list[int]) -> list[int]:
    """The ``per_server`` cores of user ``user_id``: consecutive blocks, round robin over ``cores``."""
    if per_server <= 0 or per_server >= len(cores):
        return list(cores)
    blocks = len(cores) // per_server
    start = (user_id % blocks) * per_server
    return cores[start:start + per_server]


class MemoryCgroup:
    """One memory cgroup per server: made before the spawn, joined by the server, removed after."""

    def __init__(self, user: str, limit_bytes: int):
        v1 = CGROUP_ROOT / "memory"
        self.v1 = (v1 / "memory.limit_in_bytes").exists()
        base = v1 if self.v1 else CGROUP_ROOT
        self.path = base / "parlab-hub" / user
        self.limit_bytes = limit_bytes

    def create(self) -> None:
        try:
            if not self.v1:  # v2: the parent must hand the memory controller down
                (CGROUP_ROOT / "parlab-hub").mkdir(exist_ok=True)
                (CGROUP_ROOT / "cgroup.subtree_control").write_text("+memory")
                (CGROUP_ROOT / "parlab-hub" / "cgroup.subtree_control").write_text("+memory")
            self.path.mkdir(parents=True, exist_ok=True)
            limit_file = "memory.limit_in_bytes" if self.v1 else "memory.max"
            (self.path / limit_file).write_text(str(self.limit_bytes))
        except OSError as e:
            raise RuntimeError(
                f"cannot apply the memory limit of {self.limit_bytes} bytes: {self.path}: "
                f"{os.strerror(e.errno or errno.EPERM)}. Run the hub as root on a host with a "
                "writable memory cgroup, or unset PARLAB_HUB_MEM_LIMIT (c.CourseSpawner.mem_limit) "
                "to run servers without a limit") from e

    def join_from_child(self) -> None:
        """Called in the child between fork and exec (still root): move it into the cgroup."""
        with open(self.path / "cgroup.procs", "w") as f:
            f.write(str(os.getpid()))

    def pids(self) -> list[int]:
        try:
            return [int(p) for p in (self.path / "cgroup.procs").read_text().split()]
        except OSError:
            return []

    def remove(self) -> None:
        try:
            self.path.rmdir()
        except OSError:
            pass  # still has processes (the hub's poll ends them) or already gone


class CourseSpawner(LocalProcessSpawner):
    cpus_per_server = Int(0, config=True,
                          help="cores in each server's CPU set (0: every core the hub has)")
    instructors = List(Unicode(), config=True,
                       help="users whose server gets the instructor's nbgrader config")

    def _parlab_env(self) -> dict:
        role = "instructor" if self.user.name in self.instructors else "student"
        bin_dir = str(Path(sys.executable).parent)
        return {
            "CUDA_VISIBLE_DEVICES": "",
            "JUPYTER_CONFIG_PATH": str(HUB_DIR / role),
            # terminals find this environment's nbgrader, parlab and alembic first
            "PATH": bin_dir + os.pathsep + os.environ.get("PATH", "/usr/bin:/bin"),
            "PARLAB_HUB_ROLE": role,
        }

    def get_env(self):
        env = super().get_env()
        env.update(self._parlab_env())
        return env

    def _cpu_set(self) -> list[int]:
        return cpu_block(self.user.id, self.cpus_per_server, sorted(os.sched_getaffinity(0)))

    def _cgroup(self) -> MemoryCgroup | None:
        return MemoryCgroup(self.user.name, int(self.mem_limit)) if self.mem_limit else None

    def make_preexec_fn(self, name):
        become_user = super().make_preexec_fn(name)
        cpus, cgroup = self._cpu_set(), self._cgroup()

        def preexec():
            os.sched_setaffinity(0, cpus)
            if cgroup is not None:
                cgroup.join_from_child()
            become_user()
        return preexec

    async def start(self):
        cgroup = self._cgroup()
        if cgroup is not None:
            cgroup.create()
        self.cmd = [str(Path(sys.executable).parent / "jupyterhub-singleuser")]
        return await super().start()

    async def stop(self, now=False):
        """Stop the server as LocalProcessSpawner does, then end whatever of it is left.

        The server ends its kernels, and a kernel's launch ends with it; what
        still runs in the server's cgroup after that (a kernel the server
        could not reach in time, say) is ended by pid, so a server culled in
        the middle of a launch leaves no process.
        """
        await super().stop(now=now)
        cgroup = self._cgroup()
        if cgroup is None:
            return
        for _ in range(50):
            left = cgroup.pids()
            if not left:
                break
            kill_pids(left)
            await asyncio.sleep(0.1)
        cgroup.remove()
