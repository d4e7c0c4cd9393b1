"""A per-kernel fork server: torchrun's agent and ranks start without starting Python or torch.

A cold launch used to exec a new interpreter for torchrun's agent and one per
rank, and each imported torch: most of a launch's seconds on a small machine.
Here one process per kernel, started by the kernel's first launch, imports
torch and the launcher once and then waits on a socket pair that only the
kernel holds.  For each launch it forks one child that runs torchrun, the
unchanged CLI, with ``--start-method=forkserver --run-path worker.py``:
torchrun's own options for starting the ranks by fork, here from
multiprocessing's fork server, never from the agent, whose threads could
hold a lock at the fork.  That fork server is itself forked from the agent
before torchrun starts any thread (``_fork_the_ranks_server``): a one-thread
copy of this server, torch imported, running multiprocessing's own server loop
(where that cannot be done, multiprocessing starts it as a fresh interpreter
that imports ``PRELOAD``).
So every launch still gets new processes, a new rendezvous, torchrun's
environment and failure summary, and its own folder; nothing survives from
the launch before, because the server itself never runs a task, never touches
a GPU (CUDA starts in a rank, after the fork) and never forks the kernel.

What replaces what: the agent is ``fork()`` of this server instead of
``exec(python -m parlab.launch.agent)``, multiprocessing's fork server is a
fork of the agent instead of a new interpreter, and the ranks are forked from
it instead of each exec-ing ``python -m parlab.launch.worker``.  Nothing else
of torchrun is replaced.

Rules that keep it safe where students share a host:
- one server per kernel process, its child; it dies with the kernel
  (PR_SET_PDEATHSIG), when the kernel closes the socket, and after
  ``PARLAB_FORK_SERVER_IDLE`` seconds without a launch (default 600);
- a launch whose environment differs from the server's (apart from the
  launch's own bookkeeping) replaces the server: variables read when torch is
  imported are then what the launch asked for;
- none when ``PARLAB_FORK_SERVER=0`` (an admin's switch), off Linux, in a
  grading box (``job.WRAPPER_ENV``), for Slurm and several-node launches, or
  when less than ``MEMORY_NEEDED`` is available to this process
  (the machine's free memory and the cgroup's limit);
- its children's ends are reported back over the socket, so a ``ForkedAgent``
  answers ``poll``/``wait``/``kill`` like the ``subprocess.Popen`` it replaces.

``python -m parlab.launch.fork_server FD`` is the server's side.

One module: the kernel's side (``start_agent``, ``ForkedAgent``) and the server's side
(``_serve``, ``_become_agent``) speak one private socket protocol, whose messages are defined
once here; either side changed alone would break the other.
"""
from __future__ import annotations

import json
import os
import selectors
import signal
import socket
import subprocess
import sys
import threading
import time

#: An admin's switch: "0" turns the fork server off (every launch starts cold).
ENABLE_ENV = "PARLAB_FORK_SERVER"
#: Seconds without a launch after which the server ends itself (its memory comes back).
IDLE_ENV = "PARLAB_FORK_SERVER_IDLE"
DEFAULT_IDLE = 600.0
#: Memory a server needs, about 2.5 times its resident size after importing torch
#: (226 MiB measured with torch 2.13 CPU), so that ranks forked from it have room.
MEMORY_NEEDED = 600 * 2 ** 20
#: Variables the launch sets for itself: they may differ between launches of one server.
PER_LAUNCH = ("PARLAB_JOB_DIR", "TMPDIR")
#: What torchrun's agent and a rank's start-up import, imported once in the server.  Besides the time,
#: this keeps a fork safe: a module that one of the agent's threads is importing while the agent forks
#: a rank would stay locked in the rank, and a rank that imported it too would wait forever.
PRELOAD = ("torch", "torch.distributed.run", "torch.distributed.elastic.rendezvous.c10d_rendezvous_backend",
           "torch.distributed.elastic.agent.server.local_elastic_agent", "multiprocessing.popen_fork",
           "multiprocessing.queues", "numpy.random", "cloudpickle", "datetime", "linecache", "hmac", "secrets",
           "encodings.idna", "stringprep", "parlab.launch.agent", "parlab.launch.worker",
           "parlab.launch.signed_store", "parlab.launch.results", "parlab.launch.tasks", "parlab.launch.stacks")
_READY_TIMEOUT = 120.0
_REPLY_TIMEOUT = 20.0


# ---------------------------------------------------------------------- the kernel's side

class ForkServerError(Exception):
    """The server could not start or answer; the launch starts cold instead."""


class ForkServer:
    """The kernel's handle on its server: start it, ask it for an agent, read what ended."""

    def __init__(self, env: dict):
        self.key = environment_key(env)
        self.exits: dict[int, int] = {}
        self._buffer = b""
        self._replies: list[dict] = []
        ours, theirs = socket.socketpair()
        self.sock = ours
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "parlab.launch.fork_server", str(theirs.fileno())],
                env=env, pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        finally:
            theirs.close()
        try:
            ready = self._reply(_READY_TIMEOUT)
        except BaseException:  # Ctrl-C while it imports torch: leave nothing behind
            self.close()
            raise
        if "ready" not in ready:
            self.close()
            raise ForkServerError(f"the fork server did not start: {ready.get('failed', ready)}")

    def alive(self) -> bool:
        return self.proc.poll() is None

    def spawn(self, argv: list[str], env: dict, cwd: str, log: str) -> "ForkedAgent":
        self._send({"argv": argv, "env": env, "cwd": cwd, "log": log})
        reply = self._reply(_REPLY_TIMEOUT)
        if "pid" not in reply:
            raise ForkServerError(f"the fork server could not start torchrun: {reply.get('failed', reply)}")
        return ForkedAgent(self, reply["pid"])

    def close(self) -> None:
        """End the server (by pid, the process we started) and wait for it."""
        try:
            self.sock.close()
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
            self.proc.wait()

    # -------------------------------------------------------------- the socket

    def _send(self, message: dict) -> None:
        try:
            self.sock.sendall(json.dumps(message).encode() + b"\n")
        except OSError as exc:
            raise ForkServerError(f"the fork server is gone ({exc})") from None

    def _reply(self, timeout: float) -> dict:
        deadline = time.monotonic() + timeout
        while not self._replies:
            left = deadline - time.monotonic()
            if left <= 0:
                raise ForkServerError(f"the fork server did not answer within {timeout:g} s")
            if not self.drain(left):
                raise ForkServerError("the fork server ended")
        return self._replies.pop(0)

    def drain(self, timeout: float = 0.0) -> bool:
        """Read whatever the server has said within ``timeout``; False once it has ended."""
        self.sock.settimeout(timeout if timeout > 0 else 0.0)
        try:
            chunk = self.sock.recv(65536)
        except (BlockingIOError, socket.timeout, InterruptedError):
            return True
        except OSError:
            chunk = b""
        if not chunk:
            return False
        self._buffer += chunk
        *lines, self._buffer = self._buffer.split(b"\n")
        for line in lines:
            message = json.loads(line)
            if "exited" in message:
                self.exits[message["exited"]] = message["code"]
            else:
                self._replies.append(message)
        return True


class ForkedAgent:
    """torchrun forked by the server, seen as the ``subprocess.Popen`` a cold launch has."""

    def __init__(self, server: ForkServer, pid: int):
        self.server, self.pid, self.returncode = server, pid, None

    def poll(self) -> int | None:
        if self.returncode is None:
            with _LOCK:
                if not self.server.drain(0.0):
                    self.server.exits.setdefault(self.pid, -signal.SIGKILL)  # it died with the server
                self.returncode = self.server.exits.get(self.pid)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(f"torchrun (pid {self.pid})", timeout)
            time.sleep(0.01)
        return self.returncode

    def kill(self) -> None:
        from .procs import signal_group, start_time

        if self.poll() is None:
            signal_group(self.pid, start_time(self.pid), signal.SIGKILL)


_LOCK = threading.Lock()
_SERVER: ForkServer | None = None
_FAILED_KEY: tuple | None = None  # the environment a server failed to start with: not tried again


def environment_key(env: dict) -> tuple:
    """What a server's ranks inherit from how it was started: the environment, bar the launch's own."""
    return tuple(sorted((k, v) for k, v in env.items() if k not in PER_LAUNCH))


def enabled() -> bool:
    return os.environ.get(ENABLE_ENV, "1") != "0" and sys.platform.startswith("linux") \
        and hasattr(os, "pidfd_open")


#: Where a memory cgroup keeps its limit and its use: (version, mount, limit file, use file).
_CGROUP_MEMORY = (("v2", "/sys/fs/cgroup", "memory.max", "memory.current"),
                  ("v1", "/sys/fs/cgroup/memory", "memory.limit_in_bytes", "memory.usage_in_bytes"))


def _cgroup_path(memberships: list[list[str]], version: str) -> str | None:
    """This process's memory cgroup in /proc/PID/cgroup's lines: "0::PATH" (v2) or "N:...memory...:PATH"."""
    for hierarchy, controllers, path in memberships:
        if version == "v2" and hierarchy == "0" and not controllers:
            return path
        if version == "v1" and "memory" in controllers.split(","):
            return path
    return None


def memory_available(proc_dir: str = "/proc/self", root: str = "") -> int:
    """Bytes this process may still use: free memory, capped by what its memory cgroup (v2 or v1) leaves."""
    import psutil

    free = psutil.virtual_memory().available
    try:
        with open(f"{proc_dir}/cgroup") as f:
            memberships = [line.rstrip("\n").split(":", 2) for line in f if line.count(":") >= 2]
    except OSError:
        return free
    for version, mount, limit_file, used_file in _CGROUP_MEMORY:
        path = _cgroup_path(memberships, version)
        try:
            with open(f"{root}{mount}{path}/{limit_file}") as f:
                limit = f.read().strip()
            with open(f"{root}{mount}{path}/{used_file}") as f:
                used = int(f.read())
        except (OSError, ValueError, TypeError):
            continue
        if limit.isdigit() and int(limit) < 2 ** 60:  # "max" (v2) or a huge number (v1): no limit
            free = min(free, int(limit) - used)
    return free


def start_agent(argv: list[str], env: dict, cwd: str, log: str) -> ForkedAgent | None:
    """torchrun ``argv`` forked by this kernel's server, or None: then the caller starts it cold."""
    global _SERVER, _FAILED_KEY
    if not enabled():
        return None
    key = environment_key(env)
    with _LOCK:
        if _SERVER is not None and (_SERVER.key != key or not _SERVER.alive()):
            _SERVER.close()
            _SERVER = None
        if _SERVER is None:
            if key == _FAILED_KEY or memory_available() < MEMORY_NEEDED:
                return None
            server_env = {k: v for k, v in env.items() if k not in PER_LAUNCH}
            try:
                _SERVER = ForkServer(server_env)
            except ForkServerError:
                _FAILED_KEY = key
                return None
        try:
            return _SERVER.spawn(argv, env, cwd, log)
        except ForkServerError:
            _SERVER.close()
            _SERVER = None
            return None


def stop() -> None:
    """End this kernel's server now (tests; ``%parlab`` could offer it)."""
    global _SERVER
    with _LOCK:
        if _SERVER is not None:
            _SERVER.close()
            _SERVER = None


def server_pid() -> int | None:
    """The pid of this kernel's server, if one runs."""
    with _LOCK:
        return _SERVER.proc.pid if _SERVER is not None and _SERVER.alive() else None


def describe() -> str:
    """``parlab doctor``'s line: whether this kernel's launches are forked, and if not, why."""
    if os.environ.get(ENABLE_ENV, "1") == "0":
        return f"off ({ENABLE_ENV}=0): every launch starts its interpreters cold"
    if not enabled():
        return "off: only on Linux (with pidfd_open); every launch starts its interpreters cold"
    pid = server_pid()
    if pid is not None:
        import psutil

        try:
            resident = f", {psutil.Process(pid).memory_info().rss / 2 ** 20:.0f} MiB resident"
        except psutil.Error:
            resident = ""
        return f"on (pid {pid}{resident}): launches fork torchrun and the ranks from it"
    free = memory_available()
    if free < MEMORY_NEEDED:
        return (f"off: {free / 2 ** 20:.0f} MiB available, less than the {MEMORY_NEEDED / 2 ** 20:.0f} MiB "
                "it needs; launches start cold")
    if _FAILED_KEY is not None:
        return "off: it failed to start in this environment; launches start cold"
    return "not started (the next launch starts it)"


# ---------------------------------------------------------------------- the server's side

def _serve(fd: int) -> None:
    from .procs import adopt_orphans, die_with_parent

    # No watch thread (Linux only, the parent-death signal): the server stays single-threaded, so that
    # what it forks (an agent, then the ranks' fork server) starts with no lock held by another thread.
    die_with_parent(int(os.environ.get("PARLAB_KERNEL_PID", "0")) or None, watch=False)
    adopt_orphans()  # an agent that died early hands what its ranks left to this server, which ends it
    sock = socket.socket(fileno=fd)
    try:
        import importlib

        for name in PRELOAD:
            try:
                importlib.import_module(name)
            except ImportError:
                if name.startswith(("torch", "parlab")):
                    raise  # numpy is optional; the launcher's own modules are not
    except BaseException as exc:  # noqa: BLE001 - told to the kernel, which starts cold
        sock.sendall(json.dumps({"failed": f"{type(exc).__name__}: {exc}"}).encode() + b"\n")
        return
    sock.sendall(json.dumps({"ready": os.getpid()}).encode() + b"\n")
    idle = float(os.environ.get(IDLE_ENV, DEFAULT_IDLE))
    selector = selectors.DefaultSelector()
    selector.register(sock, selectors.EVENT_READ, None)
    buffer, last_launch, children = b"", time.monotonic(), 0
    while True:
        events = selector.select(timeout=5.0)
        _end_adopted(selector)
        if not events and not children and time.monotonic() - last_launch > idle:
            return
        for key, _ in events:
            if key.data is None:  # the kernel
                chunk = sock.recv(65536)
                if not chunk:
                    return
                buffer += chunk
                *lines, buffer = buffer.split(b"\n")
                for line in lines:
                    reply = _fork_agent(json.loads(line), sock, selector)
                    if "pid" in reply:
                        children += 1
                        last_launch = time.monotonic()
                    sock.sendall(json.dumps(reply).encode() + b"\n")
            else:  # a child's pidfd: it ended
                pidfd, pid = key.fd, key.data
                selector.unregister(pidfd)
                os.close(pidfd)
                _, status = os.waitpid(pid, 0)
                children -= 1
                sock.sendall(json.dumps({"exited": pid, "code": os.waitstatus_to_exitcode(status)}).encode()
                             + b"\n")


def _end_adopted(selector) -> None:
    """SIGKILL and reap the children this server did not fork: left behind by a launch whose agent died."""
    import psutil

    agents = {key.data for key in selector.get_map().values() if key.data is not None}
    try:
        adopted = [c.pid for c in psutil.Process().children() if c.pid not in agents]
    except psutil.Error:
        return
    for pid in adopted:
        try:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        except (ProcessLookupError, ChildProcessError):
            pass


def _fork_agent(request: dict, sock: socket.socket, selector) -> dict:
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        pid = os.fork()
    except OSError as exc:
        return {"failed": f"fork: {exc}"}
    if pid == 0:
        code = 1
        try:
            code = _become_agent(request, sock, selector)
        finally:
            os._exit(code)
    selector.register(os.pidfd_open(pid), selectors.EVENT_READ, pid)
    return {"pid": pid}


def _short_socket_folder() -> None:
    """Give multiprocessing's fork server a folder whose socket path fits ``AF_UNIX``'s 108 bytes.

    Its listening socket goes in a ``pymp-*`` folder under the temporary folder; under a launch's
    TMPDIR deep in a student's home or a hub's per-user folder the path runs past the limit and the
    fork server cannot start ("AF_UNIX path too long").  Then the folder (private, 0700, removed at
    the agent's exit by multiprocessing) is made in /tmp instead.
    """
    import multiprocessing.util
    import tempfile

    if len(tempfile.gettempdir()) <= 48 or not os.path.isdir("/tmp"):
        return
    tempfile.tempdir = "/tmp"
    try:
        multiprocessing.util.get_temp_dir()  # made now, kept for this process
    finally:
        tempfile.tempdir = None


#: What multiprocessing's fork server looks like in the Pythons ``_fork_the_ranks_server`` was checked on
#: (3.11 to 3.13): its state, and the parameters of the function its process runs.
_MP_FORKSERVER_STATE = {"_forkserver_address", "_forkserver_alive_fd", "_forkserver_pid", "_inherited_fds",
                        "_lock", "_preload_modules"}
_MP_FORKSERVER_MAIN = ("listener_fd", "alive_r", "preload", "main_path", "sys_path")


def _fork_the_ranks_server() -> bool:
    """Fork multiprocessing's fork server from this agent, before torchrun starts a thread.

    torchrun's ``--start-method=forkserver`` asks multiprocessing's fork server for each rank, and
    multiprocessing would start that server as a new interpreter that imports torch again (about
    1.5 s of every launch).  At this point the agent is a one-thread copy of the kernel's fork server
    with torch imported: forking here gives the same single-threaded server at once.  It runs
    multiprocessing's own server loop (``forkserver.main``) on a socket and an "alive" pipe made as
    multiprocessing makes them, and is handed to multiprocessing as the server it would have started
    (so ``ensure_running`` finds it alive and the ranks come from it).  It dies with this agent.
    Where threads already run or multiprocessing's internals differ from those this was checked on,
    nothing is forked (False) and multiprocessing starts its interpreter as it would have.
    """
    import inspect
    from multiprocessing import connection, forkserver, util

    from .procs import die_with_parent

    server = forkserver._forkserver
    if (threading.active_count() != 1 or set(vars(server)) != _MP_FORKSERVER_STATE
            or server._forkserver_pid is not None
            or tuple(inspect.signature(forkserver.main).parameters) != _MP_FORKSERVER_MAIN):
        return False
    with socket.socket(socket.AF_UNIX) as listener:
        address = connection.arbitrary_address("AF_UNIX")
        listener.bind(address)
        os.chmod(address, 0o600)
        listener.listen()
        alive_r, alive_w = os.pipe()
        pid = os.fork()
        if pid == 0:  # the ranks' fork server
            code = 1
            try:
                os.close(alive_w)
                die_with_parent(None, watch=False)  # no thread: it forks the ranks
                forkserver.main(listener.fileno(), alive_r, [], None, None)
                code = 0
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else 0
            finally:
                os._exit(code)
        os.close(alive_r)
    server._forkserver_address = address
    server._forkserver_alive_fd = alive_w
    server._forkserver_pid = pid
    util.debug("parlab: forked multiprocessing's fork server, pid %d", pid)
    return True


def _become_agent(request: dict, sock: socket.socket, selector) -> int:
    """In the forked child: drop the server's ends, take the launch's world, run torchrun."""
    import tempfile
    import traceback

    from .procs import adopt_orphans

    server = os.getppid()
    for key in list(selector.get_map().values()):
        if key.data is not None:
            os.close(key.fd)  # other launches' pidfds
    selector.close()
    sock.close()  # only the kernel may ask for launches
    os.setsid()  # the launch's own process group, as a cold agent's start_new_session
    adopt_orphans()  # what a rank detaches stays below this agent, where the launch's end finds it
    log = os.open(request["log"], os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)
    os.close(null)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    tempfile.tempdir = None  # TMPDIR is the launch's
    sys.path[0] = request["cwd"]  # as `python -m` started in the launch's folder would have it
    _format_exceptions_plainly()
    import multiprocessing

    # The ranks fork from multiprocessing's fork server, which this agent starts: a fresh interpreter
    # with nothing but one thread, where these modules are imported once per launch (see PRELOAD).
    multiprocessing.get_context("forkserver").set_forkserver_preload(list(PRELOAD) + ["parlab.launch.forkserver_tie"])
    _short_socket_folder()
    _fork_the_ranks_server()
    from .agent import main

    try:
        main(request["argv"], parent=server)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:  # noqa: BLE001 - torchrun's failure summary goes to agent.log, as from the CLI
        traceback.print_exc()
        sys.stderr.flush()
        return 1
    sys.stdout.flush()
    sys.stderr.flush()
    return 0


class _PlainExceptionText:
    """A logging filter: an exception's text is formatted here, so torch's formatter needs no torch._dynamo.

    torchrun's agent logs a forked rank's failure with its traceback; torch's log formatter
    then imports ``torch._dynamo`` (seconds, on a busy machine) only to read a verbosity flag.
    """

    @staticmethod
    def filter(record) -> bool:
        if record.exc_info:
            import traceback

            record.exc_text = "".join(traceback.format_exception(*record.exc_info)).rstrip("\n")
            record.exc_info = None
        return True


def _format_exceptions_plainly() -> None:
    import logging

    loggers = [logging.getLogger()] + [logging.getLogger(name) for name in list(logging.Logger.manager.loggerDict)
                                       if name == "torch" or name.startswith("torch.")]
    for logger in loggers:
        for handler in logger.handlers:
            handler.addFilter(_PlainExceptionText)


if __name__ == "__main__":
    _serve(int(sys.argv[1]))
