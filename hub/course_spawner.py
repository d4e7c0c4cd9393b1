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
- its own cgroups (``ServerCgroups``), which the kernel enforces and the
  student cannot change: a CPU set of ``cpus_per_server`` cores (a block
  chosen from the user's id; parlab counts it when it divides cores among
  ranks, and ``sched_setaffinity`` cannot leave it), a memory limit
  (``mem_limit``), a process limit (``tasks_max``), and on cgroup v1 a
  devices cgroup that denies the NVIDIA devices, so a student who sets
  ``CUDA_VISIBLE_DEVICES`` back still opens no GPU.  The cgroups are made
  for every server, limit or not: on stop, what is left in them is ended.
  A cgroup that cannot be made refuses the spawn with the reason instead of
  running unlimited;
- ``JUPYTER_CONFIG_PATH`` pointing at ``hub/student`` or ``hub/instructor``:
  nbgrader's exchange, Validate's cell timeout, and which nbgrader
  extensions each side gets.

On systemd hosts (a DGX on DGX OS, TLJH) SystemdSpawner does the same with
unit properties (``systemd_units.py``); docs/jupyterhub.md has both.
"""
from __future__ import annotations

import asyncio
import errno
import os
import signal
import stat
import sys
from pathlib import Path

from jupyterhub.spawner import LocalProcessSpawner
from traitlets import Int, List, Unicode

HUB_DIR = Path(__file__).resolve().parent
CGROUP_ROOT = Path("/sys/fs/cgroup")
#: The character-device major of the NVIDIA GPUs and nvidiactl (the driver's fixed major).
NVIDIA_MAJOR = 195


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


def nvidia_devices(dev: Path = Path("/dev")) -> list[tuple[str, int, int]]:
    """The NVIDIA character devices of this host: (path, major, minor) of /dev/nvidia* and /dev/nvidia-caps/*."""
    found = []
    for path in sorted([*dev.glob("nvidia*"), *dev.glob("nvidia-caps/*")]):
        try:
            st = path.stat()
        except OSError:
            continue
        if stat.S_ISCHR(st.st_mode):
            found.append((str(path), os.major(st.st_rdev), os.minor(st.st_rdev)))
    return found


def nvidia_majors(proc_devices: str = "/proc/devices", dev: Path = Path("/dev")) -> list[int]:
    """Majors to close: 195 (the GPUs, nvidiactl), the drivers' dynamic ones (nvidia-uvm, nvidia-caps...), the nodes'."""
    majors = {NVIDIA_MAJOR}
    try:
        with open(proc_devices) as f:
            for line in f:
                if line.startswith("Block"):
                    break
                parts = line.split()
                if len(parts) == 2 and parts[0].isdigit() and parts[1].startswith("nvidia"):
                    majors.add(int(parts[0]))
    except OSError:
        pass
    majors.update(major for _, major, _ in nvidia_devices(dev))
    return sorted(majors)


class ServerCgroups:
    """One server's cgroups: its CPU set, memory limit, process limit and, on cgroup v1, no GPU device.

    Made before the spawn, joined by the server between fork and exec, and
    removed after its stop (what is left in it is ended by pid first).

    - cgroup v1 (one hierarchy per controller): ``<root>/<controller>/parlab-hub/<user>`` for
      ``cpuset``, ``memory``, ``pids`` and ``devices``; the devices cgroup denies every NVIDIA
      major (``c 195:* rwm``, nvidia-uvm's, nvidia-caps'...), so ``open("/dev/nvidia0")`` fails
      with EPERM whatever the node's mode.
    - cgroup v2 (one tree): a subtree delegated to the hub, by default the hub's own cgroup
      (``Delegate=yes`` in its systemd unit, docs/jupyterhub.md).  The hub's processes move into
      a leaf ``parlab-hub`` (a cgroup with children may hold no process), the controllers are
      handed down (``cgroup.subtree_control``), and each server gets ``parlab-servers/<user>``.
      On the root of a tree without systemd the servers go to ``/parlab-servers/<user>``.  v2 has
      no devices files (devices are eBPF there): ``closes_devices`` is False, and the spawner
      refuses to start servers on a host whose NVIDIA nodes others can open.

    The cgroup files are root's: the student's processes cannot write them, so they cannot widen
    their CPU set (``sched_setaffinity`` is bounded by the cpuset), raise their limits or open
    the devices.
    """

    V1_CONTROLLERS = ("cpuset", "memory", "pids", "devices")
    V2_CONTROLLERS = ("cpuset", "memory", "pids")

    def __init__(self, user: str, limit_bytes: int | None = None, cpus: list[int] | None = None,
                 tasks_max: int | None = None, root: Path | None = None, own_cgroup: str | None = None,
                 proc_devices: str = "/proc/devices", dev: Path = Path("/dev")):
        self.root = Path(root or CGROUP_ROOT)
        self.user, self.limit_bytes, self.cpus, self.tasks_max = user, limit_bytes, cpus, tasks_max
        self.proc_devices, self.dev = proc_devices, dev
        self.v1 = (self.root / "memory" / "memory.limit_in_bytes").exists()
        if self.v1:
            self.paths = {c: self.root / c / "parlab-hub" / user for c in self.V1_CONTROLLERS}
            self.path = self.paths["memory"]  # where the memory figures are (benchmarks/hub_load.py)
            self.base = None
        else:
            own = own_cgroup if own_cgroup is not None else _own_v2_cgroup()
            own_dir = self.root / own.strip("/")
            # after the first spawn the hub itself lives in <delegated>/parlab-hub
            self.base = own_dir.parent if own_dir.name == "parlab-hub" and own != "/" else own_dir
            self.path = self.base / "parlab-servers" / user
            self.paths = {"unified": self.path}
        self.closes_devices = self.v1

    # the one place that writes a cgroup file (a test of the v2 path records the writes)
    def _write(self, path: Path, text: str) -> None:
        with open(path, "w") as f:
            f.write(text)

    def _fail(self, what: str, path: Path, e: OSError) -> RuntimeError:
        return RuntimeError(
            f"cannot apply {what} to {self.user}'s server: {path}: {os.strerror(e.errno or errno.EPERM)}. "
            "Run the hub as root on a host with writable cgroups (cgroup v2: in a systemd unit with "
            "Delegate=yes, docs/jupyterhub.md), or use SystemdSpawner (PARLAB_HUB_SPAWNER=systemd)")

    def create(self) -> None:
        if self.v1:
            self._create_v1()
        else:
            self._create_v2()

    def _create_v1(self) -> None:
        for controller, path in self.paths.items():
            try:
                parent = path.parent
                parent.mkdir(exist_ok=True)
                if controller == "cpuset":  # v1 cpusets start empty: a child takes nothing from its parent
                    top = self.root / "cpuset"
                    for name in ("cpuset.cpus", "cpuset.mems"):
                        if not (parent / name).read_text().strip():
                            self._write(parent / name, (top / name).read_text().strip())
                path.mkdir(exist_ok=True)
                if controller == "cpuset":
                    self._write(path / "cpuset.mems", (parent / "cpuset.mems").read_text().strip())
                    self._write(path / "cpuset.cpus", cpu_list(self.cpus or _all_cpus(parent / "cpuset.cpus")))
                elif controller == "memory":
                    self._write(path / "memory.limit_in_bytes", str(self.limit_bytes) if self.limit_bytes else "-1")
                elif controller == "pids":
                    self._write(path / "pids.max", str(self.tasks_max) if self.tasks_max else "max")
                else:
                    for major in nvidia_majors(self.proc_devices, self.dev):
                        self._write(path / "devices.deny", f"c {major}:* rwm")
            except OSError as e:
                raise self._fail(f"its {controller} cgroup", path, e) from e

    def _create_v2(self) -> None:
        wanted = " ".join(f"+{c}" for c in self.V2_CONTROLLERS)
        servers = self.path.parent
        try:
            available = (self.base / "cgroup.controllers").read_text().split()
            missing = [c for c in self.V2_CONTROLLERS if c not in available]
            if missing:
                raise RuntimeError(
                    f"cannot limit {self.user}'s server: the cgroup {self.base} has no {', '.join(missing)} "
                    "controller. Start the hub in a systemd unit with Delegate=yes (docs/jupyterhub.md), "
                    "or use SystemdSpawner (PARLAB_HUB_SPAWNER=systemd)")
            if self.base != self.root:  # a cgroup with children holds no process: the hub moves to a leaf
                leaf = self.base / "parlab-hub"
                leaf.mkdir(exist_ok=True)
                for pid in (self.base / "cgroup.procs").read_text().split():
                    try:
                        self._write(leaf / "cgroup.procs", pid)
                    except ProcessLookupError:
                        pass  # ended meanwhile
            self._write(self.base / "cgroup.subtree_control", wanted)
            servers.mkdir(exist_ok=True)
            self._write(servers / "cgroup.subtree_control", wanted)
            self.path.mkdir(exist_ok=True)
            self._write(self.path / "cpuset.cpus", cpu_list(self.cpus or sorted(os.sched_getaffinity(0))))
            self._write(self.path / "memory.max", str(self.limit_bytes) if self.limit_bytes else "max")
            self._write(self.path / "pids.max", str(self.tasks_max) if self.tasks_max else "max")
        except OSError as e:
            raise self._fail("its cgroup", self.path, e) from e

    def join_from_child(self) -> None:
        """Called in the child between fork and exec (still root): move it into each cgroup."""
        for path in self.paths.values():
            with open(path / "cgroup.procs", "w") as f:
                f.write(str(os.getpid()))

    def pids(self) -> list[int]:
        found: set[int] = set()
        for path in self.paths.values():
            try:
                found.update(int(p) for p in (path / "cgroup.procs").read_text().split())
            except OSError:
                pass
        return sorted(found)

    def remove(self) -> None:
        for path in self.paths.values():
            try:
                path.rmdir()
            except OSError:
                pass  # still has processes (the hub's poll ends them) or already gone


#: The name benchmarks/hub_load.py uses (``MemoryCgroup(user, 0)``: its memory figures, its pids).
MemoryCgroup = ServerCgroups


def _own_v2_cgroup() -> str:
    with open("/proc/self/cgroup") as f:
        for line in f:
            if line.startswith("0::"):
                return line[3:].strip()
    return "/"


def _all_cpus(cpus_file: Path) -> list[int]:
    return parse_cpu_list(cpus_file.read_text())


def cpu_list(cpus: list[int]) -> str:
    """``[0, 1, 2, 5]`` -> ``"0-2,5"`` (the kernel's list format, cpuset.cpus and AllowedCPUs=)."""
    out, run = [], []
    for cpu in sorted(set(cpus)):
        if run and cpu == run[-1] + 1:
            run.append(cpu)
            continue
        if run:
            out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
        run = [cpu]
    if run:
        out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
    return ",".join(out)


def parse_cpu_list(text: str) -> list[int]:
    """``"0-2,5"`` -> ``[0, 1, 2, 5]``."""
    cpus = []
    for part in text.strip().split(","):
        if not part:
            continue
        lo, _, hi = part.partition("-")
        cpus.extend(range(int(lo), int(hi or lo) + 1))
    return cpus


def class_cpu_block(cores: int, class_size: int, setting: str | None) -> int:
    """Cores in each server's CPU set: the setting, or the cores divided by the class (at least 1).

    ``setting`` is ``PARLAB_HUB_CPUS_PER_SERVER`` (None or "" when unset).  0 means every core for
    every server, which is refused for a class of more than one: 30 students each starting 4 ranks
    of ``cores / 4`` threads would put 30 times the cores' worth of threads on the host.
    """
    if setting not in (None, ""):
        per_server = int(setting)
        if per_server == 0 and class_size > 1:
            raise ValueError(
                f"PARLAB_HUB_CPUS_PER_SERVER=0 gives each of the {class_size} users' servers all {cores} cores: "
                "every student's launches would divide the whole host among their ranks, and together "
                f"oversubscribe it {class_size} times. Leave it unset (each server gets "
                f"{max(1, cores // class_size)} cores here) or give a number of cores")
        return per_server
    return max(1, cores // max(1, class_size))


class CourseSpawner(LocalProcessSpawner):
    cpus_per_server = Int(0, config=True,
                          help="cores in each server's CPU set (0: every core the hub has; "
                               "jupyterhub_config.py derives it from the class size)")
    tasks_max = Int(2048, config=True,
                    help="processes and threads of one server, its kernels and launches (the pids cgroup)")
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

    def _cgroup(self) -> ServerCgroups:
        return ServerCgroups(self.user.name, int(self.mem_limit) if self.mem_limit else None,
                             cpus=self._cpu_set(), tasks_max=self.tasks_max)

    def make_preexec_fn(self, name):
        become_user = super().make_preexec_fn(name)
        cgroup = self._cgroup()

        def preexec():
            cgroup.join_from_child()
            become_user()
        return preexec

    async def start(self):
        cgroup = self._cgroup()
        if not cgroup.closes_devices:
            open_to_all = [path for path, _, _ in nvidia_devices() if os.stat(path).st_mode & 0o006]
            if open_to_all:
                raise RuntimeError(
                    f"this host's GPU devices ({', '.join(open_to_all)}) are open to every user, and "
                    "CourseSpawner cannot close them on cgroup v2 (devices are eBPF there): use "
                    "SystemdSpawner (PARLAB_HUB_SPAWNER=systemd: DevicePolicy=closed, docs/jupyterhub.md)")
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
        for _ in range(50):
            left = cgroup.pids()
            if not left:
                break
            kill_pids(left)
            await asyncio.sleep(0.1)
        cgroup.remove()
