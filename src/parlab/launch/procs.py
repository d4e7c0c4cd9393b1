"""Process helpers: identify a process exactly and end it without touching others.

We never kill by name.  A process is named by (pid, start time) so that a pid
that was reused by an unrelated program is left alone.  psutil gives the start
time, the state and the environment on Linux and macOS alike.
"""
from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
import time

import psutil

_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36


def _linux_start_ticks(pid: int) -> str | None:
    """The start time in /proc/<pid>/stat (clock ticks since boot), or None for a zombie.

    Unlike psutil's ``create_time`` (boot time + ticks, in wall-clock seconds),
    this number does not move when the wall clock is stepped (NTP, a virtual
    machine that was paused): a step must never make a live rank look like a
    different process.  Raises FileNotFoundError/ProcessLookupError when gone.
    """
    with open(f"/proc/{pid}/stat", "rb") as f:
        stat = f.read()
    fields = stat[stat.rindex(b")") + 2:].split()  # the name may hold spaces and ')'
    if fields[0] == b"Z":
        return None
    return "t" + fields[19].decode()  # field 22 of proc(5); fields[0] is field 3


def start_time(pid: int) -> str | None:
    """A token that changes when ``pid`` is reused, or None if ``pid`` is gone (or a zombie)."""
    if sys.platform.startswith("linux"):
        try:
            return _linux_start_ticks(pid)
        except (FileNotFoundError, ProcessLookupError):
            return None
        except PermissionError:
            return "other-user"
        except (OSError, ValueError, IndexError):
            pass  # an unusual /proc: ask psutil
    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return None
        return f"{proc.create_time():.3f}"
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return None
    except psutil.AccessDenied:  # another user's process: it exists, but is never ours
        return "other-user"


def namespace_pids(root: int) -> dict[int, int]:
    """{pid inside its own pid namespace: pid here} for every descendant of ``root``.

    A box with a pid namespace of its own (``parlab.grading.boundary``) names
    its processes by the pids it sees; the last field of ``NSpid`` in
    /proc/PID/status is that pid.  Only ``root``'s descendants are mapped, so a
    pid a box writes can only ever name one of its own processes here.
    """
    found: dict[int, int] = {}
    try:
        children = psutil.Process(root).children(recursive=True)
    except psutil.Error:
        return found
    for child in children:
        try:
            with open(f"/proc/{child.pid}/status") as f:
                line = next((ln for ln in f if ln.startswith("NSpid:")), "")
        except OSError:
            continue
        inner = line.split()[-1:] if line else []
        if inner and inner[0].isdigit():
            found.setdefault(int(inner[0]), child.pid)
    return found


def descendants(root: int) -> list[tuple[int, str]]:
    """(pid, token) of every live descendant of ``root``."""
    try:
        children = psutil.Process(root).children(recursive=True)
    except psutil.Error:
        return []
    found = [(c.pid, start_time(c.pid)) for c in children]
    return [(pid, token) for pid, token in found if token is not None]


def adopt_orphans() -> None:
    """Make this process the one that orphans below it are handed to (Linux), not init.

    A forked rank's environment is the fork server's, so a process that a rank forks and detaches
    (``setsid``) cannot be found by ``processes_with_env``; as a child subreaper the agent keeps it
    among its descendants, where the launch's end finds it.
    """
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
        except (OSError, AttributeError):
            pass


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def same_process(pid: int, token: str | None) -> bool:
    """True only when ``pid`` is, for sure, the process that had ``token``: safe for killing."""
    now = start_time(pid)
    return now is not None and token is not None and now == token


def maybe_same_process(pid: int, token: str | None) -> bool:
    """False only when ``pid`` has surely ended: safe for deciding what to delete."""
    now = start_time(pid)
    if now is None:
        return False
    return token is None or now == token or now == "other-user"


def processes_with_env(key: str, value: str) -> list[tuple[int, str]]:
    """(pid, token) of this user's processes whose environment holds key=value.

    Every process of a launch, torchrun, the ranks and anything a rank starts,
    inherits PARLAB_JOB_DIR, so this finds them all, orphans included, and
    nothing else.  Processes whose environment we may not read are skipped.
    """
    found = []
    me = os.getpid()
    uid = os.getuid()
    for proc in psutil.process_iter(["uids"]):
        try:
            if proc.pid == me or proc.info["uids"] is None or proc.info["uids"].real != uid:
                continue
            if proc.environ().get(key) != value:
                continue
        except (psutil.Error, OSError):
            continue  # gone, or not readable
        token = start_time(proc.pid)
        if token is not None:
            found.append((proc.pid, token))
    return found


def signal_group(pid: int, token: str | None, sig: int) -> bool:
    """Send ``sig`` to the process group led by ``pid`` if it is still that process.

    torchrun starts every worker in a session of its own, so the group holds
    the worker and any children it made (data loaders, shells), nothing else.
    """
    if not same_process(pid, token):
        return False
    try:
        if os.getpgid(pid) == pid:
            os.killpg(pid, sig)
        else:
            os.kill(pid, sig)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def end_processes(procs: list[tuple[int, str | None]], grace: float = 2.0) -> None:
    """SIGTERM each (pid, token), wait up to ``grace`` seconds, then SIGKILL survivors."""
    live = [p for p in procs if signal_group(p[0], p[1], signal.SIGTERM)]
    deadline = time.monotonic() + grace
    while live and time.monotonic() < deadline:
        time.sleep(0.05)
        live = [p for p in live if same_process(*p)]
    for pid, token in live:
        signal_group(pid, token, signal.SIGKILL)


def die_with_parent(expected_parent: int | None, watch: bool = True) -> None:
    """Make this process die when its parent does.

    On Linux the kernel sends SIGKILL through PR_SET_PDEATHSIG.  Everywhere a
    daemon thread also polls the parent pid, which covers macOS and the race
    where the parent died before the prctl call.  ``watch=False`` (Linux only)
    starts no thread, for a process that must stay single-threaded because it
    forks others: the race is then covered by checking the parent once, after the prctl.
    """
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        except (OSError, AttributeError):
            pass
    parent = expected_parent or os.getppid()
    if os.getppid() != parent:
        os._exit(1)
    if not watch and sys.platform.startswith("linux"):
        return

    def watch_parent() -> None:
        while True:
            time.sleep(0.5)
            if os.getppid() != parent:
                os._exit(1)

    threading.Thread(target=watch_parent, name="parlab-parent-watch", daemon=True).start()
