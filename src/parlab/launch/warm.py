"""Warm ranks: start N ranks once, then run many cells on them in a fraction of a second.

    g = parlab.start(nproc=4)          # like parlab.launch: torchrun, process group, seeds
    g.run(fn, x, y=1)                  # fn(x, y=1) on every rank -> results in rank order
    g.call(fn, args, kwargs, timeout=30)  # the same, spelled like launch(fn, args, kwargs)
    g.names(); g.reset(); g.restart(); g.stop()   # or: with parlab.start(nproc=4) as g: ...

A warm group is a cold launch whose task never ends (``warm_worker.WarmLoop``):
``Job`` starts torchrun and the ranks exactly as ``parlab.launch`` does, and
the ranks then connect back to this kernel over 127.0.0.1, authenticated with
a per-group secret that only the private job folder holds.  The listening
socket closes once every rank is connected, and only the process that started
the group may send it work.  Output, stacks, error reports and the blame rules
are the cold launch's own (``output``, ``Job._facts``, ``report.explain``).

What happens when a cell goes wrong:

- a rank raises: ``WorkerError``; when every rank answered, the group is kept;
- a rank is still busy 3 s after another raised, a collective timed out or
  a peer vanished (the process group is broken), a rank died, or the cell
  ran past its timeout (every rank's stack is collected first): the group is
  restarted, and the error says so;
- the stop button: SIGINT goes to every rank, which stops the cell where it
  is; if every rank stops within 3 s the group is kept, otherwise restarted.
"""
from __future__ import annotations

import atexit
import os
import signal
import threading
import time
import weakref
from multiprocessing.connection import wait

from . import pickling, procs, warm_link
from .errors import LaunchError, WorkerError
from .failures import classify, transient_reason
from .job import Job
from .jobdir import sweep_stale_jobs
from .options import DEFAULT_TIMEOUT, LaunchOptions, check_call, notebook_sources, pickle_task
from .output import make_sink
from .report import explain, status
from .results import decode
from .tracebacks import bare
from .warm_worker import WarmLoop, names as _rank_names, state  # noqa: F401 - state() is public

_POLL = warm_link.POLL
_SETTLE = 3.0   # after one rank raised, how long the others may take to answer
_GRACE = 3.0    # after the stop button, how long the ranks may take to stop
_groups: "weakref.WeakSet[WarmGroup]" = weakref.WeakSet()
_current = None  # the group %%rank runs on: the one started last and not stopped


def start(nproc=None, backend=None, timeout=None, env=None, debug=None, seed=0) -> "WarmGroup":
    """Start ``nproc`` ranks that wait for work; the arguments mean what they mean for ``launch``.

    ``timeout`` bounds each cell (default ``PARLAB_TIMEOUT`` or 120 s); the
    process group's own timeout is half of it, as for a cold launch.
    """
    __tracebackhide__ = True  # IPython hides launcher frames
    try:
        return start_group(LaunchOptions(nproc, backend, timeout, env, debug, seed))
    except (LaunchError, KeyboardInterrupt) as exc:
        raise bare(exc) from None


def start_group(options: LaunchOptions) -> "WarmGroup":
    """A warm group on ``options`` (checked already), booted; what ``start`` and ``%parlab start`` run."""
    __tracebackhide__ = True  # IPython hides launcher frames
    group = WarmGroup(options)
    try:
        group._boot()
    except BaseException:
        group._end_processes()
        raise
    return group


def running() -> "WarmGroup | None":
    """The warm group ``%%rank`` cells run on, or None when none was started or the last one stopped."""
    return _current if _current is not None and _current.job is not None else None


def current() -> "WarmGroup":
    """The warm group that ``%%rank`` cells run on (the last one started here and not stopped)."""
    if _current is None or _current.job is None:
        raise LaunchError("no warm group is running in this kernel: start one with `%parlab start -n 4` "
                          "or `g = parlab.start(nproc=4)`.")
    return _current


class WarmGroup:
    """Ranks kept running between cells; see the module docstring."""

    def __init__(self, options: LaunchOptions):
        if options.scheduler != "local" or options.nnodes != 1 or options.plain_results:
            raise ValueError("a warm group runs on this machine's own ranks, on one node, with the "
                             "launcher's own results: use parlab.launch for scheduler, nnodes or plain_results")
        self.options = options
        self.nproc, self.backend, self.timeout = options.nproc, options.backend, options.timeout
        self.job, self.conns, self._owner = None, {}, os.getpid()
        self._lock = threading.Lock()
        self._ids = 0
        self._sent: dict = {}   # cell file name -> the source the ranks already have
        self._pressed = False

    # ------------------------------------------------------------ public
    def run(self, fn, *args, **kwargs) -> list:
        """``fn(*args, **kwargs)`` on every rank; the results in rank order."""
        __tracebackhide__ = True  # IPython hides launcher frames
        return self.call(fn, args, kwargs)

    def call(self, fn, args=(), kwargs=None, *, timeout=None) -> list:
        """``run`` spelled like ``launch(fn, args, kwargs)``, with a timeout for this call only."""
        __tracebackhide__ = True  # IPython hides launcher frames
        task = check_call(fn, args, kwargs)
        try:
            return self._submit(task, timeout)
        except (LaunchError, KeyboardInterrupt) as exc:
            raise bare(exc) from None

    def run_cell(self, source: str, names: dict, *, filename="<rank cell>", label=None, timeout=None):
        """Run a cell's source in every rank's namespace (the engine behind ``%%rank``)."""
        __tracebackhide__ = True  # IPython hides launcher frames
        from .warm_worker import WarmCell

        try:
            return self._submit(WarmCell(source, filename, names), timeout,
                                cell=(filename, source, label or filename))
        except (LaunchError, KeyboardInterrupt) as exc:
            raise bare(exc) from None

    def names(self) -> list:
        """Per rank, the sorted names that ``%%rank`` cells (or ``state()``) stored there."""
        return self.run(_rank_names)

    def reset(self) -> None:
        """Empty every rank's namespace and seed again, keeping the processes."""
        __tracebackhide__ = True  # IPython hides launcher frames
        try:
            self._submit(None, None, kind="reset")
        except (LaunchError, KeyboardInterrupt) as exc:
            raise bare(exc) from None

    def restart(self) -> None:
        """New processes and empty namespaces (what a broken group gets by itself)."""
        __tracebackhide__ = True  # IPython hides launcher frames
        self._check_caller(running=False)
        self.stop()
        try:
            self._boot()
        except (LaunchError, KeyboardInterrupt) as exc:
            self._end_processes()
            raise bare(exc) from None

    def stop(self) -> None:
        """End every process of the group (by pid) and remove its folder; safe to call twice."""
        global _current
        if self.job is None or os.getpid() != self._owner:
            return  # a forked child never ends its parent's group
        for conn in self.conns.values():
            try:
                conn.send_bytes(pickling.dumps({"kind": "stop"}))
            except OSError:
                pass
        try:
            self.job.agent.wait(timeout=2)  # the ranks leave their loop and end as after a cold launch
        except Exception:  # noqa: BLE001 - whatever is left is ended by pid just below
            pass
        self._end_processes()
        if _current is self:
            _current = None

    def pids(self) -> dict:
        """{"torchrun": pid, "ranks": [pid of rank 0, ...]} of the running group."""
        self._check_caller()
        pids = self.job.job.pids()
        return {"torchrun": self.job.agent.pid, "ranks": [pids[r][0] for r in range(self.nproc)]}

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()

    def __repr__(self):
        what = f"{self.nproc} ranks, {self.backend}" if self.job else "stopped"
        return f"<parlab warm group: {what}>"

    # ------------------------------------------------------------ processes
    def _boot(self) -> None:
        global _current
        for attempt in (1, 2):
            sweep_stale_jobs()
            try:
                self._boot_once()
                break
            except WorkerError as err:
                reason = transient_reason(err.phase, err.failures.get(err.rank, ""))
                self._end_processes()
                if not reason or attempt == 2:
                    raise
                print(f"parlab: the ranks could not connect to each other ({reason}); starting them once more")
        _groups.add(self)
        _current = self

    def _boot_once(self) -> None:
        with warm_link.Listener(self.nproc) as listener:  # closed once every rank is connected
            loop = WarmLoop(listener.address, listener.authkey, self.options.seed)
            self.job = Job(loop, self.options)
            self.job._start()
            self.conns = listener.accept_ranks(self.job, max(self.timeout, DEFAULT_TIMEOUT))
        self._sent = {}

    def _end_processes(self) -> None:
        for conn in self.conns.values():
            conn.close()
        self.conns = {}
        if self.job is not None:
            self.job.sink = make_sink(self.nproc)  # lines printed while ending show in this cell
            self.job._end()
            self.job = None

    def _restart(self, reason: str) -> str:
        """Restart after a failure; the sentence that the error gets."""
        print(f"parlab: {reason}; restarting the warm group ({self.nproc} ranks)...", flush=True)
        self._end_processes()
        try:
            self._boot()
        except LaunchError as exc:
            self._end_processes()
            return (f"\n\nThe warm group was stopped ({reason}) and could not be started again: {exc}\n"
                    "Start a new one with parlab.start().")
        return (f"\n\nThe warm group was restarted ({reason}): new processes, so the ranks' "
                "namespaces are empty and the seeds start over.")

    # ------------------------------------------------------------ one request
    def _check_caller(self, running: bool = True) -> None:
        if os.getpid() != self._owner:
            raise LaunchError(f"this warm group belongs to process {self._owner}; only the kernel that "
                              "started it can send it work. Start a group of your own with parlab.start().")
        if running and self.job is None:
            raise LaunchError("this warm group is stopped: start it again with g.restart(), or start a "
                              "new one with parlab.start().")

    def _submit(self, task, timeout, kind: str = "run", cell=None) -> list:
        __tracebackhide__ = True  # IPython hides launcher frames
        self._check_caller()
        timeout = self.options.with_timeout(timeout)
        task_bytes = pickle_task(task) if kind == "run" else b""  # refused before anything is sent
        if not self._lock.acquire(blocking=False):
            raise LaunchError("this warm group is already running a cell (from another thread); wait for it.")
        previous = self._catch_stop_button()
        try:
            self._restart_if_broken()
            sources, labels = notebook_sources()
            if cell is not None:
                sources[cell[0]], labels[cell[0]] = cell[1], cell[2]
            self.job.labels.update(labels)
            self._ids += 1
            new = {k: v for k, v in sources.items() if self._sent.get(k) != v}
            self._sent.update(new)
            request = pickling.dumps({"id": self._ids, "kind": kind, "task": task_bytes,
                                      "sources": new, "labels": labels})
            return self._exchange(request, self._ids, timeout)
        finally:
            if previous is not None:
                signal.signal(signal.SIGINT, previous)
            self._lock.release()

    def _catch_stop_button(self):
        """While a cell runs, the stop button only raises a flag that the wait loop answers."""
        self._pressed = False
        if threading.current_thread() is not threading.main_thread():
            return None

        def pressed(signum, frame):
            self._pressed = True

        return signal.signal(signal.SIGINT, pressed)

    def _restart_if_broken(self) -> None:
        job = self.job
        if not job.job.exists():
            why = "its folder was removed (by a program cleaning the temporary folder?)"
        elif job.agent.poll() is not None:
            why = f"torchrun ended between cells (exit status {job.agent.poll()})"
        elif job._dead_ranks(job.job.pids()):
            why = f"rank(s) {job._dead_ranks(job.job.pids())} ended between cells"
        else:
            return
        note = self._restart(why).strip()
        if self.job is None:
            raise LaunchError(note)
        print(note, flush=True)

    def _exchange(self, request: bytes, rid: int, timeout: float) -> list:
        __tracebackhide__ = True  # IPython hides launcher frames
        job, n = self.job, self.nproc
        job.sink = make_sink(n)
        started = time.monotonic()
        pending, data, errors, stopped = set(range(n)), {}, {}, {}
        broken = timed_out = False
        for conn in self.conns.values():
            try:
                conn.send_bytes(request)
            except OSError:
                broken = True
        ranks_of = {conn: r for r, conn in self.conns.items()}
        first_error = forwarded = None
        while pending and not broken:
            for conn in wait([self.conns[r] for r in pending], timeout=_POLL):
                r = ranks_of[conn]
                try:
                    kind, value = warm_link.read_reply(conn, rid, r)
                except (EOFError, OSError, ValueError, KeyError):
                    broken = True  # the rank stays pending: it is the one to blame
                    continue
                {"result": data, "error": errors, "interrupted": stopped}[kind][r] = value
                pending.discard(r)
            job._pump()
            now = time.monotonic()
            job.sink.progress(now - started, sorted(set(range(n)) - pending))
            if pending and (job.agent.poll() is not None or job._dead_ranks(job.job.pids())):
                broken = True
            if errors and first_error is None:
                first_error = now
            if self._pressed and forwarded is None:
                forwarded = now
                self._forward_interrupt(pending)
            if (first_error and now > first_error + _SETTLE) or (forwarded and now > forwarded + _GRACE):
                break
            if now > started + timeout:
                timed_out = True
                break
        if forwarded is not None or self._pressed:
            self._interrupted(pending, stopped, broken, data, errors)
        if pending or broken or errors:
            self._fail(pending, broken, timed_out, data, errors, timeout)
        job._pump(final=True)
        job.sink.finish(time.monotonic() - started)
        return [None if data[r] is None else _load(r, data[r]) for r in range(n)]

    def _forward_interrupt(self, ranks) -> None:
        pids = self.job.job.pids()
        for r in ranks:
            if r in pids and procs.same_process(*pids[r]):
                os.kill(pids[r][0], signal.SIGINT)

    def _facts(self, pending, data, errors, timed_out=False, timeout=None, stacks=True):
        for r in range(self.nproc):  # the ranks append their dumps: empty the files first
            try:
                os.truncate(self.job.job.file("stack", r), 0)
            except OSError:
                pass
        f = self.job._facts(timed_out=timed_out, stop_ranks=stacks, settle=0.0)
        f.errors = errors
        f.returned = set(data)
        f.dead = [r for r in f.dead if r in pending]
        f.stacks = {r: d for r, d in f.stacks.items() if r in pending and r not in f.dead}
        f.timeout = timeout or self.timeout
        f.subject = "the cell"
        return f

    def _interrupted(self, pending, stopped, broken, data, errors) -> None:
        lines = [f"  rank {r}: interrupted {w}" for r, w in sorted(stopped.items())]
        if not pending and not broken:
            lines += [f"  rank {r}: " + ("returned" if r in data else "raised " + errors[r]["exc_type"])
                      for r in range(self.nproc) if r not in stopped]
            self.job._pump(final=True)
            print("Interrupted. Where the ranks were:\n" + "\n".join(sorted(lines)), flush=True)
            print("parlab: every rank stopped; the warm group and its namespaces are kept.", flush=True)
            raise KeyboardInterrupt
        f = self._facts(pending, data, errors)
        lines += [f"  rank {r}: {t}" for r, t in status(f).items() if r in pending]
        print("Interrupted. Where the ranks were:\n" + "\n".join(sorted(lines)), flush=True)
        print(self._restart("the stop button could not stop every rank within "
                            f"{_GRACE:g} s (a rank inside a collective stops only when it ends)").strip(),
              flush=True)
        raise KeyboardInterrupt

    def _fail(self, pending, broken, timed_out, data, errors, timeout) -> None:
        __tracebackhide__ = True  # IPython hides launcher frames
        f = self._facts(pending, data, errors, timed_out=timed_out and not errors, timeout=timeout,
                        stacks=bool(pending))
        error = explain(f) or LaunchError("a rank stopped answering the notebook")
        kind = classify(error).kind if isinstance(error, WorkerError) else "other"
        if timed_out and not errors:
            why = f"the cell ran past its timeout of {f.timeout:g} s"
        elif broken or f.dead:
            why = "a rank died, so the process group is broken"
        elif pending:
            why = f"rank(s) {sorted(pending)} were still busy {_SETTLE:g} s after another rank raised"
        elif kind in ("hang", "mismatch", "died"):
            why = "a collective failed, so the process group cannot be trusted"
        else:
            why = None
        note = self._restart(why) if why else \
            "\n\nThe warm group is still running; every rank answered and kept its namespace."
        error.args = (str(error) + note,)
        raise error


def _load(rank: int, data: bytes):
    try:
        return decode(data)
    except Exception as exc:  # noqa: BLE001
        raise LaunchError(f"rank {rank}'s result could not be loaded in the notebook "
                          f"({type(exc).__name__}: {exc})") from None


@atexit.register
def _stop_all() -> None:
    for group in list(_groups):
        group.stop()
