"""Process helpers: identify a process exactly and end it without touching others.

We never kill by name.  A process is named by (pid, start time) so that a pid
that was reused by an unrelated program is left alone.
"""
from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import threading
import time

_PR_SET_PDEATHSIG = 1


def start_time(pid: int) -> str | None:
    """A token that changes when ``pid`` is reused, or None if ``pid`` is gone."""
    if not os.path.isdir("/proc/self"):
        return _start_time_from_ps(pid)
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    # The command name (field 2) may contain spaces and parentheses.
    fields = data[data.rindex(b")") + 2:].split()
    if fields[0] == b"Z":  # a zombie has already exited
        return None
    return fields[19].decode()  # field 22 overall: start time in clock ticks


def _start_time_from_ps(pid: int) -> str | None:
    """Where there is no /proc (macOS): ps's start time, made into one word."""
    try:
        out = subprocess.run(["ps", "-o", "lstart=", "-o", "stat=", "-p", str(pid)],
                             capture_output=True, text=True, timeout=5).stdout.split()
    except (OSError, subprocess.SubprocessError):
        return None
    if not out or out[-1].startswith("Z"):
        return None
    return "_".join(out[:-1])


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
        return alive(pid) and not os.path.isdir("/proc/self")  # ps failed but the pid exists
    return token is None or now == token


def processes_with_env(key: str, value: str) -> list[tuple[int, str]]:
    """(pid, token) of this user's processes whose environment holds key=value (Linux).

    Every process of a launch, torchrun, the ranks and anything a rank starts,
    inherits PARLAB_JOB_DIR, so this finds them all, orphans included, and
    nothing else.  Returns [] where /proc is missing.
    """
    needle = b"\0" + f"{key}={value}".encode() + b"\0"
    found = []
    try:
        pids = [int(p) for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return []
    for pid in pids:
        if pid == os.getpid():
            continue
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if needle not in b"\0" + f.read() + b"\0":
                    continue
        except OSError:
            continue  # gone, or another user's
        token = start_time(pid)
        if token is not None:
            found.append((pid, token))
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


def die_with_parent(expected_parent: int | None) -> None:
    """Make this process die when its parent does.

    On Linux the kernel sends SIGKILL through PR_SET_PDEATHSIG.  Everywhere a
    daemon thread also polls the parent pid, which covers macOS and the race
    where the parent died before the prctl call.
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

    def watch() -> None:
        while True:
            time.sleep(0.5)
            if os.getppid() != parent:
                os._exit(1)

    threading.Thread(target=watch, name="parlab-parent-watch", daemon=True).start()
