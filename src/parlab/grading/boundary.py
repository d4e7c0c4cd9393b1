"""The operating-system boundary around a graded submission's untrusted code.

Untrusted while a submission is graded: the student's kernel (it runs every
cell) and the sandbox's ranks (they unpickle and run the student's answers).
Trusted: nbgrader, ``GuardedExecute``, the sandbox process that imports the
checks and reads back plain data, and the one writer that merges grades.
So the two untrusted parts are boxed *separately* from the trusted ones: a
box around the whole worker would let the student's code rewrite the
per-copy gradebook or the verdict file that decide its own score.

Each box is a bubblewrap sandbox (Debian's ``bubblewrap``) entered through
``python -m parlab.grading.boundary kernel|ranks SPEC -- COMMAND``, a short
trusted step that, before it execs ``bwrap``:

- puts itself in the submission's cgroups (memory and pids, cgroup v1 or
  v2, where this user may create them; under v1 below the grader's own,
  so that a Slurm task's cgroup bounds the boxes it grades) and sets
  per-process limits (``RLIMIT_AS`` for memory, ``RLIMIT_NPROC``, no core
  files);
- hands the folders the box may write to the box's user;
- when run as root, drops to the submission's own unprivileged uid
  (claimed for this submission only, never a real user's), so that nothing
  in the box can signal, ptrace or write anything of the grader's.

Inside ``bwrap``: the whole filesystem read-only (``--ro-bind / /``), with
empty tmpfs over the course root (``solutions/``, ``submitted/``, the
gradebook), ``$HOME``, ``/root``, ``/home`` and ``/tmp``; the Python
environment and the installed package bound back read-only; a bounded
writable scratch (``--size N --tmpfs``); a network namespace of its own
(``--unshare-net``: loopback only); an environment cleared to a short list
(``--clearenv``: no ``JUPYTERHUB_API_TOKEN`` or the like).  Each box has a
pid namespace and a ``/proc`` of its own: it sees only its own processes,
cannot signal any other, and all of them die with it.  The launcher names
a boxed rank by the pid the rank writes, mapped to its own side's pid among
the launch's descendants (``parlab.launch.procs.namespace_pids``), and
believes it only for a process of the box's uid
(``parlab.launch.job.WRAPPER_ENV``).  The folders the grader reads back
(the hand-in folder, the ranks' launch folders) are, as root, a tmpfs of
the box's own; ``RLIMIT_FSIZE`` bounds every file a box writes.

A non-root grader cannot change uid, mount or, usually, create cgroups:
then the boxes run as the grader's own uid in a user namespace, bounded by
the per-process limits only (``docs/instructor.md`` says what differs).

(One module, about 700 lines: the box's spec, its command line, the uid
and cgroup claims and the trusted entry step are one boundary, read and
reviewed together; split, each part would be checked without the others.)

One module on purpose: it is the grading's security boundary, the trusted set-up outside the
box and the steps that exec ``bwrap`` and drop to the box's uid, and a reviewer checks it as one
piece; the spec it writes outside is read inside by the same code.
"""
from __future__ import annotations

import fcntl
import json
import os
import re
import resource
import secrets
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

INSTALL = "sudo apt-get install bubblewrap (Debian/Ubuntu) or sudo dnf install bubblewrap (Fedora)"
#: Where root keeps the claims on box uids (one locked file per uid in use).
UID_CLAIMS = Path("/run/parlab-boundary")
#: Box uids are drawn from [UID_BASE, UID_BASE + UID_SPAN): far above any real account's.
UID_BASE, UID_SPAN = 2_000_000_000, 1 << 20  # below 2**31: bwrap maps uids as signed ints
#: What the box's environment keeps of the grader's (everything else is cleared).
KEPT_ENV = ("PATH", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "OMP_NUM_THREADS", "MKL_NUM_THREADS",
            "PARLAB_TIMEOUT", "PARLAB_MAX_LINES", "PARLAB_DEBUG", "CUDA_VISIBLE_DEVICES",
            # process tracking only (whoever started the grading finds and ends the box's processes)
            "PARLAB_HARNESS_TOKEN", "PARLAB_GRADE_JOB")
#: The launcher's own variables, kept in the ranks' box.
LAUNCH_ENV = ("PARLAB_JOB_DIR", "TMPDIR", "PYTHONUNBUFFERED", "TORCH_DISTRIBUTED_DEBUG")
HOSTNAME = "parlab-box"
#: The pids cgroup allows this many more than RLIMIT_NPROC (threads of the grader's own in the cgroup).
PIDS_BACKSTOP = 64
#: Where the submission's own files appear, read-only, inside the kernel's box.
SUBMISSION_RO = "/var/tmp/parlab-submission"


class BoundaryError(RuntimeError):
    """The boundary cannot be set up here (the message says what to do); nothing was run."""


@dataclass(frozen=True)
class Limits:
    """What one submission may use; exceeding one costs that submission only."""

    memory_bytes: int = 6 << 30      # the cgroup's total, and RLIMIT_AS of each process
    processes: int = 1024            # pids.max of the cgroup, and RLIMIT_NPROC of the box's uid
    scratch_bytes: int = 512 << 20   # each writable tmpfs (the scratch copy, /tmp)

    def describe(self) -> dict[str, str]:
        return {"memory": f"{self.memory_bytes / 2**30:g} GiB", "processes": f"{self.processes} processes",
                "scratch": f"{self.scratch_bytes / 2**20:g} MiB of scratch disk"}


#: What to do when bwrap cannot make a user namespace for a non-root grader (Ubuntu 23.10 and later:
#: AppArmor restricts unprivileged user namespaces, https://ubuntu.com/blog/ubuntu-23-10-restricted-unprivileged-user-namespaces).
USERNS_REMEDY = ("grade as root on the host (docs/jupyterhub.md, Grading), or load AppArmor's profile for bwrap, "
                 "which Ubuntu 24.04 ships disabled: sudo ln -s /usr/share/apparmor/extra-profiles/bwrap-userns-restrict "
                 "/etc/apparmor.d/ && sudo apparmor_parser -r /etc/apparmor.d/bwrap-userns-restrict")


def userns_blocked(bwrap: str) -> str | None:
    """Why bwrap cannot box as this (non-root) user, or None: it makes a user namespace once to see."""
    tried = subprocess.run([bwrap, "--unshare-user", "--ro-bind", "/", "/", "true"], capture_output=True, text=True,
                           timeout=30)
    if tried.returncode == 0:
        return None
    why = tried.stderr.strip() or f"exit {tried.returncode}"
    try:
        with open("/proc/sys/kernel/apparmor_restrict_unprivileged_userns") as f:
            if f.read().strip() == "1":
                why += "; AppArmor restricts unprivileged user namespaces (kernel.apparmor_restrict_unprivileged_userns=1)"
    except OSError:
        pass
    return why


def bwrap_path() -> str:
    """The ``bwrap`` binary, or BoundaryError saying how to install it, or, not as root, how to let it box."""
    found = shutil.which("bwrap")
    if not found:
        raise BoundaryError(
            "grading needs bubblewrap (bwrap) to run each submission inside an operating-system boundary, "
            f"and it is not installed: {INSTALL}. (An instructor who grades only trusted notebooks can "
            "turn the boundary off with c.GuardedExecute.boundary = False in nbgrader_config.py.)")
    if os.geteuid() != 0 and (why := userns_blocked(found)):
        raise BoundaryError(f"bwrap cannot box submissions as this user ({why}): {USERNS_REMEDY}")
    return found


def course_root(start: Path) -> Path | None:
    """The outermost folder above ``start`` holding an ``nbgrader_config.py`` (a parlab grade copy's course)."""
    found = None
    for folder in [start, *start.parents]:
        if (folder / "nbgrader_config.py").is_file():
            found = folder
    return found


def project_root() -> Path | None:
    """The source tree of an editable install of parlab (its ``solutions/`` and ``tests/`` too), if it is one."""
    import parlab

    for folder in Path(parlab.__file__).resolve().parents:
        if (folder / "pyproject.toml").is_file():
            return folder
        if folder.name == "site-packages":
            return None
    return None


def _code_paths() -> list[str]:
    """The Python environment and every import path: bound back read-only inside the box."""
    import parlab

    prefixes = {os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)}
    paths = prefixes | {os.path.realpath(Path(parlab.__file__).resolve().parent.parent)}
    # installed code only: never the current folder or another folder someone put on sys.path
    # (``python -m`` puts the working folder there: a course copy's root, with its solutions/)
    paths |= {real for p in sys.path if p and os.path.isdir(p)
              if any(_inside(real := os.path.realpath(p), prefix) for prefix in prefixes)
              or os.path.basename(real) in ("site-packages", "dist-packages")}
    return sorted(paths)


def _interpreter_inside() -> str:
    """This interpreter by a path the box has: under the environment's real folder, which ``_code_paths``
    binds back.  ``sys.executable`` may go through a link that the box hides (a checkout's ``.venv``
    that links to a venv elsewhere); the venv's own ``bin/python`` under its real folder keeps it a venv."""
    candidate = os.path.join(os.path.realpath(sys.prefix), "bin", os.path.basename(sys.executable))
    if os.path.isfile(candidate) and os.path.realpath(candidate) == os.path.realpath(sys.executable):
        return candidate
    return sys.executable


def _inside(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip("/") + "/")


# ---------------------------------------------------------------- the uid and the cgroups
def _claim_uid() -> tuple[int, int]:
    """(uid, the open claim file) of an unused box uid; root only."""
    import psutil

    UID_CLAIMS.mkdir(mode=0o700, parents=True, exist_ok=True)
    in_use = {p.info["uids"].real for p in psutil.process_iter(["uids"]) if p.info["uids"]}
    for _ in range(64):
        uid = UID_BASE + secrets.randbelow(UID_SPAN)
        if uid in in_use:
            continue
        fd = os.open(UID_CLAIMS / str(uid), os.O_CREAT | os.O_RDWR, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # released if this process dies
        except BlockingIOError:
            os.close(fd)
            continue
        return uid, fd
    raise BoundaryError(f"no free box uid found in {UID_CLAIMS}")


CGROUP_MOUNT = Path("/sys/fs/cgroup")
#: Memory the trusted grader needs beside a box inside the same enclosing cgroup (nbgrader, the sandbox process).
GRADER_RESERVE = 1 << 30
_BOX_CGROUP = re.compile(r"parlab-box-(\d+)-[0-9a-f]{8}")


def _cgroup_parents() -> dict[str, Path]:
    """{"memory": dir, "pids": dir} where this process's box cgroups go.

    cgroup v1: below this process's own cgroup of each controller, so that
    whatever encloses the grader (a Slurm task's cgroup, a systemd unit's)
    bounds its boxes too and sees their processes; nested cgroups are
    hierarchical.  cgroup v2 (not tested here): the root, as a box must be
    a leaf and this process's own cgroup already holds processes.
    """
    if (CGROUP_MOUNT / "cgroup.controllers").is_file():
        return {"memory": CGROUP_MOUNT, "pids": CGROUP_MOUNT}
    own = {}
    try:
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            _, controllers, path = line.split(":", 2)
            for kind in controllers.split(","):
                own[kind] = path
    except (OSError, ValueError):
        pass
    parents = {}
    for kind in ("memory", "pids"):
        mine = CGROUP_MOUNT / kind / own.get(kind, "/").lstrip("/")
        parents[kind] = mine if mine.is_dir() else CGROUP_MOUNT / kind
    return parents


def _cgroup_dirs(name: str) -> dict[str, Path]:
    """{"memory": dir, "pids": dir} of new cgroups for the box, where this user may make them."""
    made: dict[str, Path] = {}
    for kind, parent in _cgroup_parents().items():
        folder = parent / name
        try:
            folder.mkdir(exist_ok=True)
            made[kind] = folder
        except OSError:
            continue
    return made


def enclosing_memory(folder: Path) -> int | None:
    """The smallest memory limit (bytes) of ``folder`` and the cgroups above it (v1, or v2's memory.max)."""
    found = None
    for up in [folder, *folder.parents]:
        if not _inside(str(up), str(CGROUP_MOUNT)) or up == CGROUP_MOUNT.parent:
            break
        for knob in ("memory.limit_in_bytes", "memory.max"):
            try:
                text = (up / knob).read_text().strip()
            except OSError:
                continue
            if text.isdigit() and int(text) < 1 << 60:  # "max" and v1's near-2**63 mean no limit
                found = int(text) if found is None else min(found, int(text))
    return found


def box_memory(wanted: int, enclosing: int | None) -> int:
    """The box's memory bound: ``wanted``, or less where the enclosing cgroup leaves less beside the grader.

    The box must reach its own bound first: where the enclosing cgroup's
    (a Slurm task's ``--mem``) is reached instead, its OOM killer may end
    the trusted grader, and the cell gets no note naming the bound.
    """
    if enclosing is None:
        return wanted
    return max(min(wanted, enclosing - GRADER_RESERVE), 256 << 20)


def remove_stale_cgroups(parents=None) -> None:
    """rmdir the empty box cgroups below ``parents`` (default: this process's) whose uid no Box holds.

    A Box removes its cgroups when it closes; a grader killed first (a
    cancelled Slurm task, SIGKILL) leaves them, where they would keep a
    Slurm task's own cgroup from being removed.  Root only (box uids are claimed by root).
    """
    if os.geteuid() != 0:
        return
    for parent in set((parents or _cgroup_parents()).values()):
        try:
            names = [entry.name for entry in parent.iterdir() if _BOX_CGROUP.fullmatch(entry.name)]
        except OSError:
            continue
        for name in names:
            uid = int(_BOX_CGROUP.fullmatch(name).group(1))
            if not UID_BASE <= uid < UID_BASE + UID_SPAN:
                continue
            try:
                fd = os.open(UID_CLAIMS / str(uid), os.O_RDWR)
            except FileNotFoundError:
                fd = None
            except OSError:
                continue
            try:
                if fd is not None:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # held: that Box is alive
                (parent / name).rmdir()  # fails while a process is in it
            except OSError:
                pass
            finally:
                if fd is not None:
                    os.close(fd)


def _write(path: Path, value) -> bool:
    try:
        path.write_text(str(value))
        return True
    except OSError:
        return False


#: The source name of a box folder's tmpfs in /proc/self/mountinfo (how a stale one is found).
TMPFS_SOURCE = "parlab-box"
#: The box folder's tmpfs holds this many scratch folders' worth: the answers, and the ranks'
#: launch folders with their output and TMPDIR (torch's caches).
FOLDER_SCRATCHES = 2
#: How GuardedExecute names its work folders (``tempfile.mkdtemp(prefix=...)``).
WORKDIR_PREFIX = "parlab-autograde-"
#: In a work folder: "PID START" of the grader using it, written before its box folder is mounted.
_LIVE = "grader.pid"


def _libc():
    import ctypes

    return ctypes.CDLL(None, use_errno=True)


def _mount_tmpfs(folder: Path, size: int) -> bool:
    """Mount a tmpfs of ``size`` bytes on ``folder`` (root only); whether it was mounted."""
    if os.geteuid() != 0:
        return False
    flags = 2 | 4  # MS_NOSUID | MS_NODEV (not noexec: torch may compile and load code in a launch folder)
    options = f"size={size},mode=0700".encode()
    return _libc().mount(TMPFS_SOURCE.encode(), os.fsencode(folder), b"tmpfs", flags, options) == 0


def _unmount(folder: Path) -> None:
    """Detach the tmpfs on ``folder`` (its files go with it)."""
    _libc().umount2(os.fsencode(folder), 2)  # MNT_DETACH


def remove_stale_mounts() -> int:
    """Detach the box folders' tmpfs left by graders killed before closing their box; how many.

    A box folder's tmpfs sits on ``.../parlab-autograde-*/box``; it is stale
    once the grader named in the work folder's ``grader.pid`` (written before
    the mount) is no longer running.  Root only.
    """
    if os.geteuid() != 0:
        return 0
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return 0
    stale = 0
    for line in lines:
        fields = line.split(" - ", 1)
        if len(fields) != 2 or not fields[1].startswith(f"tmpfs {TMPFS_SOURCE} "):
            continue
        where = fields[0].split()[4].encode().decode("unicode_escape")
        if Path(where).name != "box" or not Path(where).parent.name.startswith(WORKDIR_PREFIX):
            continue
        if _in_use(where):
            continue
        _unmount(Path(where))
        shutil.rmtree(Path(where).parent, ignore_errors=True)
        stale += 1
    return stale


def _in_use(box_dir: str) -> bool:
    """Whether the grader that made this box folder still runs (its pid file names a live process)."""
    try:
        pid, token = (Path(box_dir).parent / _LIVE).read_text().split()
    except (OSError, ValueError):
        return False
    from ..launch.procs import same_process

    return same_process(int(pid), token)


@dataclass(frozen=True)
class Spec:
    """What the entry step needs to build a box: written by ``Box``, read by ``main``."""

    uid: int
    gid: int
    drop_to_uid: bool
    hidden: list
    code: list
    cgroups: dict
    limits: dict
    handin: str
    ipc: str
    bwrap: str
    hosts: str


class Box:
    """One submission's boundary: its uid, cgroups and folders, from creation to ``close``.

    Created by ``GuardedExecute`` (trusted) before the kernel starts, closed
    after the sandbox has graded; ``close`` ends every process of the box.
    """

    def __init__(self, workdir: Path, notebook_dir: Path, limits: Limits = Limits()):
        self.asked_memory = limits.memory_bytes  # ``limits`` holds what applies (see ``box_memory``)
        self.limits = limits
        self.bwrap = bwrap_path()
        self.dir = Path(workdir) / "box"
        self.dir.mkdir(mode=0o700)
        from ..launch.procs import start_time

        (Path(workdir) / _LIVE).write_text(f"{os.getpid()} {start_time(os.getpid())}")  # before the mount
        remove_stale_mounts()
        # what the boxes write that the grader reads (answers, the ranks' launch folders and their
        # TMPDIR) is on the grader's disk: as root, in a tmpfs of this box's own, twice the scratch
        self.mounted = _mount_tmpfs(self.dir, FOLDER_SCRATCHES * limits.scratch_bytes)
        self._claim = None
        try:
            self._set_up(Path(notebook_dir), limits)
        except BaseException:
            if self.mounted:  # a box never made is never closed: nothing of it may stay mounted
                _unmount(self.dir)
                self.mounted = False
            if self._claim is not None:
                os.close(self._claim)
            raise

    def _set_up(self, notebook_dir: Path, limits: Limits) -> None:
        self.handin, self.ipc = self.dir / "handin", self.dir / "ipc"
        self.launches = self.dir / "launches"  # the sandbox's TMPDIR: its ranks' launch folders
        for folder in (self.handin, self.ipc, self.launches):
            folder.mkdir(mode=0o700)
        if os.geteuid() == 0:
            self.uid, self._claim = _claim_uid()
            self.gid = self.uid
        else:
            self.uid, self.gid = os.getuid(), os.getgid()
        remove_stale_cgroups()
        self.cgroups = _cgroup_dirs(f"parlab-box-{self.uid}-{secrets.token_hex(4)}")
        if "memory" in self.cgroups:  # no more than the enclosing cgroup leaves beside the grader
            limits = self.limits = replace(limits, memory_bytes=box_memory(
                limits.memory_bytes, enclosing_memory(self.cgroups["memory"].parent)))
            for knob in ("memory.limit_in_bytes", "memory.max"):
                _write(self.cgroups["memory"] / knob, limits.memory_bytes)
            _write(self.cgroups["memory"] / "memory.swap.max", 0)
        if "pids" in self.cgroups:
            _write(self.cgroups["pids"] / "pids.max", limits.processes + PIDS_BACKSTOP)
        root = course_root(notebook_dir.resolve())
        hidden = [str(p) for p in (root, project_root(), Path.home(), Path("/root"), Path("/home"))
                  if p is not None]
        self.spec_path = self.dir / "spec.json"  # in the workdir, which no box sees
        spec = Spec(self.uid, self.gid, os.geteuid() == 0, sorted({os.path.realpath(h) for h in hidden}),
                    _code_paths(), {k: str(v) for k, v in self.cgroups.items()}, asdict(limits),
                    str(self.handin), str(self.ipc), self.bwrap, str(self.dir / "hosts"))
        (self.dir / "hosts").write_text(f"127.0.0.1 localhost {HOSTNAME}\n::1 localhost {HOSTNAME}\n")
        self.spec_path.write_text(json.dumps(asdict(spec)))
        self._counted = self.counters()

    # ------------------------------------------------------------ what runs inside
    def command(self, mode: str) -> list[str]:
        """The prefix that starts a command inside a box: ``mode`` is "kernel" or "ranks"."""
        return [sys.executable, "-m", "parlab.grading.boundary", mode, str(self.spec_path), "--"]

    def agent_wrapper(self) -> str:
        """The value of ``parlab.launch.job.WRAPPER_ENV`` for the sandbox: its ranks start boxed."""
        return json.dumps({"command": self.command("ranks"), "uid": self.uid, "pid_namespace": True})

    # ------------------------------------------------------------ bounds reached
    def counters(self) -> dict[str, int]:
        """How often each cgroup bound was hit so far (memory limit hits, OOM kills, refused forks)."""
        out = {}
        mem, pids = self.cgroups.get("memory"), self.cgroups.get("pids")
        for kind, folder, files in (("memory", mem, ("memory.failcnt", "memory.events")),
                                    ("processes", pids, ("pids.events",))):
            if folder is None:
                continue
            total = 0
            for name in files:
                try:
                    text = (folder / name).read_text()
                except OSError:
                    continue
                if name == "memory.failcnt":
                    total += int(text.strip() or 0)
                else:
                    total += sum(int(v) for k, v in (line.split() for line in text.splitlines() if line.strip())
                                 if k in ("max", "oom_kill"))
            if kind == "processes":  # RLIMIT_NPROC refuses first: a peak at the bound means it was reached
                try:
                    peak = int((folder / "pids.peak").read_text().strip())
                except (OSError, ValueError):  # no pids.peak (cgroup v1, kernels before 6.1)
                    peak = 0
                # or the uid's tasks now, what RLIMIT_NPROC counts over the whole system (a fork bomb holds
                # them): seen at the bound where the cgroup's peak was not (a fresh-clone CI run's h3 did)
                held = self._claim is not None and _tasks_of(self.uid) >= self.limits.processes
                total += peak >= self.limits.processes or held
            out[kind] = total
        return out

    def bounds_hit(self) -> list[str]:
        """The bounds reached since the last call, in words ("memory (6 GiB)")."""
        now = self.counters()
        hit = [kind for kind, n in now.items() if n > self._counted.get(kind, 0)]
        self._counted = now
        words = self.limits.describe()
        return [words[k] for k in hit]

    # ------------------------------------------------------------ the end
    def processes(self) -> list[int]:
        """Every live process of the box: in its cgroups, or (for a claimed uid) running as its uid."""
        import psutil

        pids: set[int] = set()
        for folder in self.cgroups.values():
            try:
                pids |= {int(p) for p in (folder / "cgroup.procs").read_text().split()}
            except (OSError, ValueError):
                pass
        if self._claim is not None:
            for p in psutil.process_iter(["uids"]):
                if p.info["uids"] and self.uid in (p.info["uids"].real, p.info["uids"].effective):
                    pids.add(p.pid)
        pids.discard(os.getpid())
        return sorted(pids)

    def end_processes(self, patience: float = 10.0) -> None:
        """SIGKILL every process of the box (only its own: its cgroups, its uid) until none is left."""
        deadline = time.monotonic() + patience
        while (left := self.processes()) and time.monotonic() < deadline:
            for pid in left:
                try:
                    os.kill(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
            time.sleep(0.05)

    def close(self) -> None:
        self.end_processes()
        for folder in set(self.cgroups.values()):
            for _ in range(100):
                try:
                    folder.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.05)  # the last processes are still being reaped
        if self.mounted:
            _unmount(self.dir)
            self.mounted = False
        if self._claim is not None:
            os.close(self._claim)
            (UID_CLAIMS / str(self.uid)).unlink(missing_ok=True)
            self._claim = None


# ---------------------------------------------------------------- the entry steps (trusted, then exec)
def _hand_over(folder: str, uid: int, gid: int) -> None:
    """Give ``folder`` and what is in it to the box's user, never following a link."""
    if os.geteuid() != 0:
        return
    for top, dirs, files in os.walk(folder):
        for name in [top, *(os.path.join(top, n) for n in dirs + files)]:
            try:
                os.chown(name, uid, gid, follow_symlinks=False)
            except OSError:
                pass


def _box_env(mode: str, home: str) -> dict[str, str]:
    keep = KEPT_ENV + (LAUNCH_ENV if mode == "ranks" else ("PARLAB_AUTOGRADE",))
    env = {k: os.environ[k] for k in keep if k in os.environ}
    # the box's uid has no passwd entry: getpass.getuser() (torchrun calls it) reads these first
    env.update({"HOME": home, "USER": "parlab-box", "LOGNAME": "parlab-box", "PYTHONDONTWRITEBYTECODE": "1",
                "MPLBACKEND": "Agg"})
    if mode == "ranks":
        env["PARLAB_KERNEL_PID"] = "0"  # the agent's parent is bwrap: it dies with bwrap (--die-with-parent)
    else:
        env["TMPDIR"] = "/tmp"
    return env


def bwrap_args(spec: dict, mode: str, cwd: str) -> list[str]:
    """The ``bwrap`` command line of a box (the command goes after it)."""
    size = str(spec["limits"]["scratch_bytes"])
    args = [spec["bwrap"], "--die-with-parent", "--unshare-net", "--unshare-ipc", "--unshare-uts",
            "--hostname", HOSTNAME]
    args += ["--unshare-pid"]  # both boxes: the host's processes are neither seen nor signalled
    # the box's own hostname names its loopback (torchrun's rendezvous looks the hostname up)
    args += ["--ro-bind", "/", "/", "--ro-bind", spec["hosts"], "/etc/hosts", "--dev", "/dev"]
    args += ["--proc", "/proc"]  # the pid namespace's own
    for dev in sorted(Path("/dev").glob("nvidia*")):  # GPUs stay usable in the box
        args += ["--dev-bind", str(dev), str(dev)]
    for folder in ("/tmp", "/var/tmp", "/dev/shm"):
        args += ["--perms", "1777", "--size", size, "--tmpfs", folder]
    for folder in spec["hidden"]:
        if os.path.isdir(folder) and not _inside(folder, "/tmp"):
            args += ["--size", "1048576", "--tmpfs", folder]
    covers = ["/tmp", "/var/tmp"] + [h for h in spec["hidden"] if os.path.isdir(h)]
    binds = [("--ro-bind", path, path) for path in spec["code"]  # bound back where a hidden folder covered it
             if any(_inside(path, c) for c in covers) and not any(_inside(h, path) for h in spec["hidden"])]
    if mode == "kernel":
        binds += [("--bind", folder, folder) for folder in (spec["ipc"], spec["handin"])]
        binds += [("--ro-bind", cwd, SUBMISSION_RO)]
    else:
        job = os.environ["PARLAB_JOB_DIR"]
        binds += [("--bind", job, job)]
    made: set[str] = set()
    for how, source, dest in binds:
        args += _parents(dest, covers, made) + [how, source, dest]
    if mode == "kernel":  # the scratch: a bounded tmpfs where the notebook ran
        args += _parents(cwd, covers, made) + ["--perms", "0700", "--size", size, "--tmpfs", cwd, "--chdir", cwd]
    else:
        args += ["--chdir", os.environ["PARLAB_JOB_DIR"]]
    env = _box_env(mode, cwd if mode == "kernel" else os.environ.get("TMPDIR", "/tmp"))
    args += ["--clearenv"] + [a for k, v in sorted(env.items()) for a in ("--setenv", k, v)]
    return args


def _parents(path: str, covers: list[str], made: set) -> list[str]:
    """``--dir`` for each folder bwrap must make on the way to ``path`` inside a tmpfs: traversable, not 0700."""
    out = []
    for up in reversed(Path(path).parents):
        up = str(up)
        if up not in made and any(_inside(up, c) and up != c for c in covers):
            made.add(up)
            out += ["--perms", "0755", "--dir", up]
    return out


def _enter_cgroups(spec: dict) -> None:
    for folder in set(spec["cgroups"].values()):
        _write(Path(folder) / "cgroup.procs", os.getpid())


def _tasks_of(uid: int) -> int:
    """How many processes and threads run as ``uid`` (what RLIMIT_NPROC counts)."""
    count = 0
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.stat(f"/proc/{entry}").st_uid == uid:
                    count += len(os.listdir(f"/proc/{entry}/task"))
            except OSError:
                continue
    return count


def _set_limits(spec: dict) -> None:
    limits = spec["limits"]
    # no file larger than a scratch folder, wherever it is written (a folder the grader reads is on
    # the grader's disk; as root it is also a bounded tmpfs, see Box); Python ignores SIGXFSZ: EFBIG
    settings = [(resource.RLIMIT_CORE, 0), (resource.RLIMIT_FSIZE, limits["scratch_bytes"])]
    # the box's uid is its own when root claimed one; otherwise the grader's, whose processes count too
    # RLIMIT_NPROC binds first: it refuses a fork before the kernel copies anything, where the pids
    # cgroup (the backstop, a little higher) refuses only after copying the whole address space
    settings.append((resource.RLIMIT_NPROC, limits["processes"] + (0 if spec["drop_to_uid"] else _tasks_of(os.getuid()))))
    if "memory" not in spec["cgroups"]:  # no cgroup to bound the total: bound each process (CUDA needs the cgroup)
        settings.append((resource.RLIMIT_AS, limits["memory_bytes"]))
    for which, value in settings:
        _, hard = resource.getrlimit(which)
        value = value if hard == resource.RLIM_INFINITY else min(value, hard)
        resource.setrlimit(which, (value, value))


def enter(mode: str, spec: dict, command: list[str]) -> None:
    """Outside the box (trusted): cgroups, limits, the box's folders; then exec ``bwrap``."""
    cwd = os.getcwd()
    _enter_cgroups(spec)
    writable = [spec["ipc"], spec["handin"]] if mode == "kernel" else [os.environ["PARLAB_JOB_DIR"]]
    for folder in writable:
        _hand_over(folder, spec["uid"], spec["gid"])
    _set_limits(spec)
    python = _interpreter_inside()
    if command and os.path.realpath(command[0]) == os.path.realpath(sys.executable):
        command = [python, *command[1:]]  # the kernel's or a rank's interpreter: this one, by a path the box has
    inner = [python, "-m", "parlab.grading.boundary", "inside", str(spec["uid"]), str(spec["gid"]),
             "copy" if mode == "kernel" else "-", "--", *command]
    # bwrap itself gets only the box's environment: its processes' environ holds no token either
    env = _box_env(mode, cwd if mode == "kernel" else os.environ.get("TMPDIR", "/tmp"))
    os.execve(spec["bwrap"], bwrap_args(spec, mode, cwd) + ["--", *inner], env)


def inside(uid: int, gid: int, copy: bool, command: list[str]) -> None:
    """First step inside the box: the scratch copy of the submission, then the box's uid, then exec."""
    if copy:
        shutil.copytree(SUBMISSION_RO, ".", dirs_exist_ok=True, symlinks=True)
        _hand_over(".", uid, gid)
    if os.geteuid() == 0:  # bwrap ran as root: become the submission's uid (every capability goes with root)
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(38, 1, 0, 0, 0)  # PR_SET_NO_NEW_PRIVS
        os.setgroups([])
        os.setgid(gid)
        os.setuid(uid)
    os.execvp(command[0], command)


def main(argv: list[str]) -> int:
    usage = ("usage: python -m parlab.grading.boundary kernel|ranks SPEC.json -- COMMAND...  "
             "(inside UID GID copy|- -- COMMAND... is its second step, run by bwrap)")
    if len(argv) >= 4 and argv[0] in ("kernel", "ranks") and argv[2] == "--":
        enter(argv[0], json.loads(Path(argv[1]).read_text()), argv[3:])
    elif len(argv) >= 6 and argv[0] == "inside" and argv[4] == "--":
        inside(int(argv[1]), int(argv[2]), argv[3] == "copy", argv[5:])
    print(usage, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
