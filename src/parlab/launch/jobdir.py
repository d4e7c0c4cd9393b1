"""The job folder: every file that the kernel and a launch's ranks share.

One launch owns ``$TMPDIR/parlab-<uid>/launch-<kernel pid>-<start time>-<random>/``.
(Before parlab 0.2 the folders were called ``job-...`` with another kind of
start time; the two versions leave each other's folders alone, so a kernel
still running the old code never sweeps a live launch of the new code.)

==============  ==========  =====================================================
file            written by  holds
==============  ==========  =====================================================
``task.pkl``    kernel      the pickled task (function call, script or cell)
``spec.pkl``    kernel      backend, timeouts, seed, sys.path, cell sources, the store secret
``agent.log``   torchrun    torchrun's own output, with its failure summary
``tmp/``        torchrun    TMPDIR of every process of the launch
``out.r``       rank r      fd 1 (C++ output included), tailed by the kernel
``err.r``       rank r      fd 2; faulthandler's crash report lands here too
``pid.r``       rank r      "pid start-time": who rank r is, for killing safely
``stack.r``     rank r      faulthandler's stack dump, asked for with SIGUSR1
``ending.r``    rank r      empty: rank r left the task and is writing its outcome
``result.r``    rank r      the return value (cloudpickle, or torch.save when plain)
``error.r``     rank r      JSON error record: plain text only, never a pickle
==============  ==========  =====================================================

Every file that is read while it may be written (pid, result, error) is
written to ``<name>.part`` and renamed, so a reader sees all of it or none.
The ranks' files are read only as plain files (``parlab.plainfile``): a
rank that puts a link or a FIFO in their place (in a grading box, where the
reader is the trusted grader) is read as a missing file, never through the
link and never waiting.
"""
from __future__ import annotations

import json
import os
import pickle
import stat
import tempfile

from ..plainfile import open_plain, read_plain

#: Every process of a launch inherits this variable, set to the launch's folder.
JOB_ENV = "PARLAB_JOB_DIR"
#: Folder names are ``<PREFIX>-<kernel pid>-<kernel start time>-<random>``.
PREFIX = "launch"
#: The spec's per-launch secret: only this user can read it (see ``signed_store.py``).
STORE_SECRET = "store_secret"

_RECORD_FIELDS = {"rank": int, "kind": str, "exc_type": str, "message": str, "traceback": str,
                  "time": (int, float)}


def atomic_write(path: str, data: bytes) -> None:
    tmp = f"{path}.part"
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


class JobDir:
    """Names and reads/writes the files of one launch (see the module docstring)."""

    def __init__(self, path: str):
        self.path = path

    # ------------------------------------------------------------ names
    def file(self, kind: str, rank: int) -> str:
        return os.path.join(self.path, f"{kind}.{rank}")

    @property
    def task(self) -> str:
        return os.path.join(self.path, "task.pkl")

    @property
    def spec(self) -> str:
        return os.path.join(self.path, "spec.pkl")

    @property
    def agent_log(self) -> str:
        return os.path.join(self.path, "agent.log")

    @property
    def tmp(self) -> str:
        return os.path.join(self.path, "tmp")

    # ------------------------------------------------------------ kernel side
    @classmethod
    def create(cls, root: str, task_bytes: bytes, spec: dict) -> "JobDir":
        from .procs import start_time

        me = os.getpid()
        job = cls(tempfile.mkdtemp(prefix=f"{PREFIX}-{me}-{start_time(me)}-", dir=root))
        os.makedirs(job.tmp)
        with open(job.task, "wb") as f:
            f.write(task_bytes)
        with open(job.spec, "wb") as f:  # the ranks sign what they put in the c10d store with this
            pickle.dump({**spec, STORE_SECRET: os.urandom(32)}, f)
        return job

    def exists(self) -> bool:
        return os.path.isdir(self.path)

    def pids(self) -> dict[int, tuple[int, str | None]]:
        """rank -> (pid, start-time token) for the ranks that have started."""
        pids = {}
        for name in os.listdir(self.path) if os.path.isdir(self.path) else []:
            if name.startswith("pid.") and name[4:].isdigit():
                try:
                    pid, token = read_plain(os.path.join(self.path, name)).decode().split()
                    pids[int(name[4:])] = (int(pid), None if token == "None" else token)
                except (OSError, ValueError):
                    pass
        return pids

    def has(self, kind: str, rank: int) -> bool:
        return os.path.exists(self.file(kind, rank))

    def finished(self, rank: int) -> bool:
        return self.has("result", rank) or self.has("error", rank)

    def errors(self, nproc: int) -> dict[int, dict]:
        """rank -> error record, for every rank that wrote one (read as JSON, checked)."""
        errors = {}
        for r in range(nproc):
            try:
                data = read_plain(self.file("error", r))
            except OSError:
                continue
            errors[r] = checked_record(data, r)
        return errors

    def read_bytes(self, kind: str, rank: int) -> bytes:
        return read_plain(self.file(kind, rank))

    def read_text(self, kind: str, rank: int, last_bytes: int | None = None) -> str:
        """The file's text (its last ``last_bytes`` only, if given), or "" when missing."""
        try:
            with os.fdopen(open_plain(self.file(kind, rank)), "rb") as f:
                if last_bytes is not None:
                    f.seek(max(0, os.fstat(f.fileno()).st_size - last_bytes))
                return f.read().decode("utf-8", "replace")
        except OSError:
            return ""

    def agent_text(self) -> str:
        try:
            return read_plain(self.agent_log).decode("utf-8", "replace")
        except OSError:
            return ""

    # ------------------------------------------------------------ rank side
    def write_pid(self, rank: int, pid: int, token: str | None) -> None:
        atomic_write(self.file("pid", rank), f"{pid} {token}".encode())

    def mark_ending(self, rank: int) -> None:
        os.close(os.open(self.file("ending", rank), os.O_WRONLY | os.O_CREAT, 0o600))

    def write_error(self, rank: int, record: dict) -> None:
        atomic_write(self.file("error", rank), json.dumps(record).encode())

    def write_result(self, rank: int, data: bytes) -> None:
        atomic_write(self.file("result", rank), data)

    def read_spec(self) -> dict:
        with open(self.spec, "rb") as f:
            return pickle.load(f)


def checked_record(data: bytes, rank: int) -> dict:
    """An error record as plain strings and numbers; a malformed one is described, not trusted."""
    try:
        record = json.loads(data.decode("utf-8"))
        ok = isinstance(record, dict) and all(isinstance(record.get(k), t) for k, t in _RECORD_FIELDS.items())
    except (UnicodeDecodeError, ValueError):
        ok = False
    if ok:
        return {k: record[k] for k in _RECORD_FIELDS}
    return {"rank": rank, "kind": "raised", "exc_type": "LaunchError", "time": 0.0, "traceback": "",
            "message": f"rank {rank} wrote an error report that is not a parlab error record"}


# ---------------------------------------------------------------- the jobs folder


def jobs_root() -> str:
    return os.path.join(tempfile.gettempdir(), f"parlab-{os.getuid()}")


def private_jobs_root() -> str:
    """The per-user folder for launches, refusing one that another user could tamper with.

    Another user may have created ``$TMPDIR/parlab-<uid>`` first (a squatter), as a
    folder or a link: it is refused.  A folder of ours that was left open to others
    is made private again, with a notice; whatever another user put into it
    meanwhile is never read (``sweep_stale_jobs`` skips it).
    """
    from .errors import LaunchError

    root = jobs_root()
    parent = os.path.dirname(root)
    pst = os.stat(parent)
    if pst.st_mode & 0o022 and not pst.st_mode & stat.S_ISVTX:
        raise LaunchError(f"the temporary folder {parent} can be written by other users and has no "
                          "sticky bit, so another user could replace your launch folders in it. Set "
                          "TMPDIR to a folder only you can write (e.g. mkdir -m 700 ~/tmp), then retry.")
    os.makedirs(root, mode=0o700, exist_ok=True)
    st = os.lstat(root)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
        what = "a link" if stat.S_ISLNK(st.st_mode) else f"owned by uid {st.st_uid}"
        raise LaunchError(f"{root} is not a folder owned by you (uid {os.getuid()}) but {what}; someone "
                          "else may have created it to see or change your launches. Remove it (ask the "
                          "administrator if it is not yours to remove), or set TMPDIR to a private "
                          "folder, then retry.")
    loose = stat.S_IMODE(st.st_mode) & 0o077
    if loose:
        os.chmod(root, 0o700)
        import sys

        print(f"parlab: {root} was open to other users (mode {stat.S_IMODE(st.st_mode):04o}); it is "
              "private again (0700). Files other users left in it are ignored.", file=sys.stderr)
    return root


def _owned_folder(path: str) -> bool:
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid()


def sweep_stale_jobs() -> int:
    """Remove the folders (and any survivors) of launches whose kernel has died."""
    import shutil

    from . import procs

    root = jobs_root()
    removed = 0
    try:
        names = os.listdir(root)
    except FileNotFoundError:
        return 0
    for name in names:
        parts = name.split("-")
        if len(parts) != 4 or parts[0] != PREFIX or not parts[1].isdigit() \
                or not _owned_folder(os.path.join(root, name)):
            continue  # not ours (another parlab's, another user's, a link): leave it alone
        owner, token = int(parts[1]), parts[2]
        if procs.maybe_same_process(owner, None if token == "None" else token):
            continue
        job = JobDir(os.path.join(root, name))
        survivors = set(job.pids().values()) | set(procs.processes_with_env(JOB_ENV, job.path))
        procs.end_processes(list(survivors), grace=0.5)
        shutil.rmtree(job.path, ignore_errors=True)
        removed += 1
    return removed
