"""Run code from a notebook on many ranks through torchrun.

``launch(fn)`` pickles ``fn`` (by value when it was defined in the notebook),
starts ``python -m parlab._agent`` (torchrun tied to this kernel) in a new
session, streams each rank's output into the cell, and returns the ranks'
results in rank order.  However the launch ends (return, error, timeout,
interrupt), every process it started is ended by pid and its files removed.
"""
from __future__ import annotations

import operator
import os
import pickle
import secrets
import shutil
import subprocess
import sys
import tempfile
import time

from . import _pickling

from . import _procs, _stacks
from ._output import FileTail, make_sink
from ._tasks import CallTask, CellTask, ScriptTask
from .errors import LaunchError, LaunchTimeout, WorkerError

#: Default seconds before a launch is stopped.  It suits the CPU labs (a cold
#: 4-rank start costs about 10 s on 2 cores) and stays well below the course's
#: nbgrader cell timeout, so a hang surfaces as LaunchTimeout, not a killed cell.
DEFAULT_TIMEOUT = 120.0
BACKENDS = ("gloo", "nccl", "mpi")
_POLL = 0.05
_NOT_STARTED = "not started yet (still importing) or not responding"


def launch(fn, args=(), kwargs=None, *, nproc=None, backend=None, timeout=None, env=None,
           debug=None, seed=0) -> list:
    """Run ``fn(*args, **kwargs)`` on ``nproc`` ranks and return their results in rank order.

    Inside each rank the process group is initialised, ``parlab.device()`` is
    the rank's device, and torch/random/numpy are seeded with ``seed + rank``.

    Args:
        nproc: number of ranks; default the visible GPUs, or 2 on CPU.
        backend: "gloo", "nccl" or "mpi"; default NCCL when every rank can
            have its own GPU, else gloo.
        timeout: seconds before the launch is stopped with LaunchTimeout
            (default ``PARLAB_TIMEOUT`` or 120).  The process group's own
            timeout is half of it, so a stuck collective fails first.
        env: extra environment variables for the ranks.
        debug: turn on ``TORCH_DISTRIBUTED_DEBUG=DETAIL``, which names
            mismatched collectives at once (also ``PARLAB_DEBUG=1``).
        seed: base seed; rank r uses ``seed + r``.
    """
    __tracebackhide__ = True  # IPython hides launcher frames
    if not callable(fn):
        raise TypeError(f"launch() needs a function to run on each rank, got {type(fn).__name__}")
    if isinstance(args, (str, bytes)) or not isinstance(args, (tuple, list)):
        raise TypeError(f"args must be a tuple of positional arguments, got {type(args).__name__}: "
                        "for a single argument write args=(x,)")
    if kwargs is not None and not isinstance(kwargs, dict):
        raise TypeError(f"kwargs must be a dict, got {type(kwargs).__name__}")
    task = CallTask(fn, tuple(args), dict(kwargs or {}))
    return _Job(task, nproc, backend, timeout, env, debug, seed).run()


def run_script(path, nproc=None, args=(), *, backend=None, timeout=None, env=None, debug=None,
               seed=0) -> list:
    """Run a Python file on ``nproc`` ranks as ``__main__``, like ``torchrun path *args``.

    The process group is already up when the script starts; a script that
    calls ``init_process_group`` itself keeps working.  Returns one None per rank.
    """
    __tracebackhide__ = True  # IPython hides launcher frames
    path = os.path.abspath(os.fspath(path))
    if not os.path.isfile(path):
        raise FileNotFoundError(f"run_script: no such file {path!r}")
    task = ScriptTask(path, [str(a) for a in args])
    return _Job(task, nproc, backend, timeout, env, debug, seed).run()


def run_cell(source, names, *, nproc=None, backend=None, timeout=None, env=None, debug=None,
             seed=0, filename="<torchrun cell>", label=None) -> list:
    """Run a cell's source on every rank (the engine behind ``%%torchrun``)."""
    __tracebackhide__ = True  # IPython hides launcher frames
    job = _Job(CellTask(source, filename, names), nproc, backend, timeout, env, debug, seed)
    job.sources[filename] = source
    if label:
        job.labels[filename] = label
    return job.run()


# --------------------------------------------------------------------------- checks


def _visible_gpus() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def choose_backend(nproc, backend):
    """Validate (nproc, backend) and fill in the defaults; raises before anything starts."""
    gpus = None
    if nproc is None:
        gpus = _visible_gpus()
        nproc = gpus or 2
    try:
        if isinstance(nproc, bool):
            raise TypeError
        nproc = operator.index(nproc)  # accepts numpy integers too
    except TypeError:
        raise TypeError(f"nproc must be a whole number of ranks, got {nproc!r}") from None
    if nproc < 1:
        raise ValueError(f"nproc must be at least 1, got {nproc}")
    if backend is None:
        gpus = _visible_gpus() if gpus is None else gpus
        backend = "nccl" if 0 < nproc <= gpus else "gloo"
    if not isinstance(backend, str) or backend.lower() not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}: choose one of {', '.join(BACKENDS)} "
                         "(gloo runs everywhere, nccl needs one GPU per rank)")
    backend = backend.lower()
    if backend == "nccl":
        gpus = _visible_gpus() if gpus is None else gpus
        if gpus == 0:
            raise LaunchError("backend='nccl' needs GPUs, but this machine has none visible "
                              "(torch.cuda.is_available() is False). Use backend='gloo' to run on CPU.")
        if nproc > gpus:
            raise ValueError(f"backend='nccl' needs one GPU per rank: nproc={nproc} but only {gpus} "
                             f"GPU(s) are visible. Use nproc<={gpus}, or backend='gloo' for CPU ranks.")
    if backend == "mpi":
        import torch.distributed as dist

        if not dist.is_mpi_available():
            raise LaunchError("backend='mpi' is not available in this torch build (it needs torch "
                              "compiled with MPI). Use backend='gloo' on CPU or 'nccl' on GPUs.")
    return nproc, backend


def _check_timeout(timeout) -> float:
    import math

    source = "timeout"
    if timeout is None:
        source, timeout = "PARLAB_TIMEOUT", os.environ.get("PARLAB_TIMEOUT", DEFAULT_TIMEOUT)
        try:
            timeout = float(timeout)
        except ValueError:
            pass
    if (isinstance(timeout, bool) or not isinstance(timeout, (int, float))
            or not math.isfinite(timeout) or timeout <= 0):
        raise ValueError(f"{source} must be a positive, finite number of seconds, got {timeout!r}")
    return float(timeout)


def _check_env(env) -> dict:
    if env is None:
        return {}
    if not isinstance(env, dict):
        raise TypeError(f"env must be a dict of environment variables, got {type(env).__name__}")
    bad = [k for k, v in env.items() if not isinstance(k, str) or not isinstance(v, str)]
    if bad:
        raise TypeError(f"env keys and values must be strings; not so for {bad!r}: "
                        "write e.g. env={'MY_FLAG': '1'}")
    return dict(env)


def _pickle_task(task) -> bytes:
    try:
        return _pickling.dumps(task)
    except Exception as exc:  # noqa: BLE001 - name the culprit instead
        culprit = _find_unpicklable(task)
        raise TypeError(
            f"{culprit} cannot be sent to the ranks because it cannot be pickled "
            f"({type(exc).__name__}: {exc}). Pass plain data (tensors, numbers, lists, dicts) and "
            "create locks, files, generators, process groups or CUDA state inside the function."
        ) from None


def _find_unpicklable(task) -> str:
    if isinstance(task, CallTask):
        parts = [("the function", task.fn)]
        parts += [(f"argument {i} ({type(a).__name__})", a) for i, a in enumerate(task.args)]
        parts += [(f"keyword argument {k!r} ({type(v).__name__})", v) for k, v in task.kwargs.items()]
    elif isinstance(task, CellTask):
        parts = [(f"notebook variable {k!r} ({type(v).__name__})", v) for k, v in task.names.items()]
    else:
        parts = []
    for what, obj in parts:
        try:
            _pickling.dumps(obj)
        except Exception:  # noqa: BLE001
            return what
    return "the task"


def _notebook_sources() -> tuple[dict, dict]:
    """Source text and ``Cell In[n]`` labels of this kernel's cells, for remote tracebacks."""
    import linecache

    labels = {}
    try:
        from IPython import get_ipython

        ip = get_ipython()
        mapping = getattr(getattr(ip, "compile", None), "_filename_map", None) or {}
        labels = {name: f"Cell In[{n}]" for name, n in mapping.items()}
    except ImportError:
        pass
    sources = {}
    for name in labels:
        entry = linecache.cache.get(name)
        if entry and entry[2]:
            sources[name] = "".join(entry[2])
    return sources, labels


# --------------------------------------------------------------------------- jobs


#: Every process of a launch inherits this variable, set to the launch's folder.
JOB_ENV = "PARLAB_JOB_DIR"


def _jobs_root() -> str:
    return os.path.join(tempfile.gettempdir(), f"parlab-{os.getuid()}")


def _private_jobs_root() -> str:
    """The per-user folder for launches, refusing one that another user could tamper with."""
    root = _jobs_root()
    os.makedirs(root, mode=0o700, exist_ok=True)
    st = os.lstat(root)
    import stat

    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
        raise LaunchError(f"{root} is not a folder owned by you (uid {os.getuid()}); someone else may "
                          "have created it. Remove it, or set TMPDIR to a private folder, then retry.")
    if stat.S_IMODE(st.st_mode) & 0o077:
        os.chmod(root, 0o700)
    return root


def sweep_stale_jobs() -> int:
    """Remove the folders (and any survivors) of launches whose kernel has died."""
    root = _jobs_root()
    removed = 0
    try:
        names = os.listdir(root)
    except FileNotFoundError:
        return 0
    for name in names:
        parts = name.split("-")
        if len(parts) != 4 or parts[0] != "job" or not parts[1].isdigit():
            continue  # not ours: leave it alone
        owner, token = int(parts[1]), parts[2]
        if _procs.maybe_same_process(owner, None if token == "None" else token):
            continue
        path = os.path.join(root, name)
        survivors = set(_read_pids(path).values()) | set(_procs.processes_with_env(JOB_ENV, path))
        _procs.end_processes(list(survivors), grace=0.5)
        shutil.rmtree(path, ignore_errors=True)
        removed += 1
    return removed


def _read_pids(job: str) -> dict:
    pids = {}
    for name in os.listdir(job) if os.path.isdir(job) else []:
        if name.startswith("pid."):
            try:
                with open(os.path.join(job, name)) as f:
                    pid, token = f.read().split()
                pids[int(name[4:])] = (int(pid), None if token == "None" else token)
            except (OSError, ValueError):
                pass  # being written right now; read it next time
    return pids


class _Job:
    def __init__(self, task, nproc, backend, timeout, env, debug, seed):
        self.nproc, self.backend = choose_backend(nproc, backend)
        self.timeout = _check_timeout(timeout)
        self.extra_env = _check_env(env)
        if debug is None:
            debug = os.environ.get("PARLAB_DEBUG", "") not in ("", "0")
        self.debug = bool(debug)
        self.seed = int(seed)
        self.task_bytes = _pickle_task(task)
        self.sources, self.labels = _notebook_sources()
        self.agent = None
        self.dir = None

    # ---------------------------------------------------------------- life cycle

    def run(self) -> list:
        __tracebackhide__ = True  # IPython hides launcher frames
        for attempt in (1, 2):
            sweep_stale_jobs()
            try:
                self._start()
                return self._wait()
            except _TransientStartFailure as failure:
                if attempt == 2:
                    raise failure.error from None
                sys.stderr.write(f"parlab: the ranks could not connect to each other ({failure.reason}); "
                                 "starting them once more\n")
            except KeyboardInterrupt:
                where = self._collect_stacks(self._unfinished(), wait=1.0)
                if where:
                    sys.stderr.write("Interrupted. Where the ranks were:\n" + self._status_lines(where) + "\n")
                raise
            finally:
                self._end()
        raise AssertionError("unreachable")

    def _start(self) -> None:
        self.agent, self.dir = None, None
        root = _private_jobs_root()
        me = os.getpid()
        self.dir = tempfile.mkdtemp(prefix=f"job-{me}-{_procs.start_time(me)}-", dir=root)
        os.makedirs(os.path.join(self.dir, "tmp"))
        with open(os.path.join(self.dir, "task.pkl"), "wb") as f:
            f.write(self.task_bytes)
        spec = {
            "backend": self.backend,
            "pg_timeout": max(1.0, self.timeout / 2),
            "seed": self.seed,
            "sys_path": [os.getcwd()] + [p for p in sys.path if p],
            "sources": self.sources,
            "cell_labels": self.labels,
        }
        with open(os.path.join(self.dir, "spec.pkl"), "wb") as f:
            pickle.dump(spec, f)
        self.tails = [(r, s, FileTail(os.path.join(self.dir, f"{s}.{r}")))
                      for r in range(self.nproc) for s in ("out", "err")]
        self.sink = make_sink(self.nproc)
        cmd = [sys.executable, "-m", "parlab._agent", "--standalone",
               f"--nproc-per-node={self.nproc}", "--max-restarts=0",
               "-m", "parlab._worker", self.dir]
        self.agent_log = open(os.path.join(self.dir, "agent.log"), "wb")
        self.agent = subprocess.Popen(cmd, env=self._env(), stdin=subprocess.DEVNULL,
                                      stdout=self.agent_log, stderr=subprocess.STDOUT,
                                      start_new_session=True)
        self.agent_token = _procs.start_time(self.agent.pid)
        self.deadline = time.monotonic() + self.timeout

    def _env(self) -> dict:
        env = dict(os.environ)
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
        threads = str(max(1, (cores or 1) // self.nproc))
        if self.backend != "nccl":
            env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = threads
        else:
            env.setdefault("OMP_NUM_THREADS", threads)
        if self.debug:
            env["TORCH_DISTRIBUTED_DEBUG"] = "DETAIL"
        env.update(self.extra_env)
        env.pop("PARLAB_AGENT_PID", None)
        env.update({  # the launcher's own bookkeeping: env= cannot override these
            "PARLAB_KERNEL_PID": str(os.getpid()),
            JOB_ENV: self.dir,
            "PYTHONUNBUFFERED": "1",
            "TMPDIR": os.path.join(self.dir, "tmp"),  # torchrun's torchelastic_* folder lands here
        })
        return env

    def _end(self) -> None:
        """End every process of this launch by pid, then remove its folder.

        A second press of the stop button must not cut the clean-up short, so
        SIGINT waits until it is done (only the main thread may do this).
        """
        import signal
        import threading

        guard = threading.current_thread() is threading.main_thread()
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN) if guard else None
        try:
            self._end_processes()
        finally:
            if guard:
                signal.signal(signal.SIGINT, previous)

    def _end_processes(self) -> None:
        if self.agent is not None:
            procs = set(_read_pids(self.dir).values())
            if self.agent.poll() is None:
                procs.add((self.agent.pid, self.agent_token))
            procs |= set(_procs.processes_with_env(JOB_ENV, self.dir))  # e.g. a rank's children
            _procs.end_processes(list(procs))
            try:
                self.agent.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.agent.kill()
                self.agent.wait()
            self.agent_log.close()
            self._pump(final=True)
            self.sink.finish()
        if self.dir:
            shutil.rmtree(self.dir, ignore_errors=True)

    # ---------------------------------------------------------------- watching

    def _pump(self, final: bool = False) -> None:
        for rank, stream, tail in self.tails:
            for line in tail.read_lines(final):
                self.sink.line(rank, stream, line)

    def _path(self, kind: str, rank: int) -> str:
        return os.path.join(self.dir, f"{kind}.{rank}")

    def _errors(self) -> dict:
        errors = {}
        for r in range(self.nproc):
            if os.path.exists(self._path("error", r)):
                with open(self._path("error", r), "rb") as f:
                    errors[r] = pickle.load(f)
        return errors

    def _finished(self, r: int) -> bool:
        return os.path.exists(self._path("result", r)) or os.path.exists(self._path("error", r))

    def _unfinished(self) -> list[int]:
        return [r for r in range(self.nproc) if not self._finished(r)]

    def _wait(self) -> list:
        __tracebackhide__ = True  # IPython hides launcher frames
        while True:
            if not os.path.isdir(self.dir):
                raise LaunchError(f"the launch's folder {self.dir} was removed while it ran (by another "
                                  "program cleaning the temporary folder?); run the cell again.")
            self._pump()
            code = self.agent.poll()
            if code is not None and code < 0:  # torchrun itself was killed: its ranks follow it
                return self._after_exit(code)
            dead = self._dead_ranks()
            errors = self._errors()
            if dead:
                return self._died(dead, errors)
            if errors:
                return self._fail(errors)
            if code is not None:
                return self._after_exit(code)
            if time.monotonic() > self.deadline:
                return self._time_out()
            time.sleep(_POLL)

    def _after_exit(self, code: int) -> list:
        __tracebackhide__ = True  # IPython hides launcher frames
        self._pump(final=True)
        errors = self._errors()
        if errors:
            return self._fail(errors)
        missing = self._unfinished()
        if code == 0 and not missing:
            return [self._load_result(r) for r in range(self.nproc)]
        dead = self._dead_ranks() if code >= 0 else []
        if dead:
            return self._died(dead, {})
        if code < 0:
            raise LaunchError(f"torchrun (pid {self.agent.pid}) was killed by signal {-code} "
                              f"({_describe_exit(code)[1]}) while rank(s) {missing} were running; they "
                              "were stopped with it. Run the cell again.")
        log = self._agent_log().splitlines()[-25:]
        who = f"rank(s) {missing} never finished" if missing else "every rank finished"
        raise LaunchError(f"torchrun exited with code {code} and {who}, but no rank reported an error "
                          "or died. torchrun's last lines:\n" + "\n".join(log))

    def _agent_log(self) -> str:
        try:
            with open(os.path.join(self.dir, "agent.log"), "rb") as f:
                return f.read().decode("utf-8", "replace")
        except OSError:
            return ""

    def _dead_ranks(self) -> list[int]:
        """Ranks whose process ended without a result or an error report: crashed or exited."""
        return sorted(r for r, p in _read_pids(self.dir).items()
                      if not self._finished(r) and not _procs.same_process(*p))

    def _died(self, dead: list[int], errors: dict) -> list:
        __tracebackhide__ = True  # IPython hides launcher frames
        stacks = self._collect_stacks([r for r in self._unfinished() if r not in dead])
        try:  # torchrun notices within a moment and writes each rank's exit status
            self.agent.wait(timeout=3)
        except subprocess.TimeoutExpired:
            pass
        codes = _exit_codes(self._agent_log())
        r = next((d for d in dead if d in codes), dead[0])
        how, exc_type = _describe_exit(codes.get(r))
        self._pump(final=True)
        tail = self._stderr_tail(r)
        others = {k: v for k, v in self._status(stacks, errors).items() if k != r}
        for k in dead:
            if k != r:
                others[k] = "died too (" + _describe_exit(codes.get(k))[0] + ")"
        lines = [f"rank {r} died without raising a Python exception: {how}.",
                 ("Where it crashed:" if tail.startswith("Fatal Python error") else "Its last lines of stderr:")
                 if tail else "It printed nothing to stderr.", tail]
        if others:
            lines += ["", "The other ranks:"] + [f"  rank {k}: {v}" for k, v in sorted(others.items())]
        raise WorkerError("\n".join(x for x in lines if x is not None).rstrip(), rank=r,
                          remote_traceback=tail, exc_type=exc_type,
                          stacks={k: _stacks.format_dump(v, self.labels) for k, v in stacks.items()},
                          failures={k: f"{e['exc_type']}: {e['message']}" for k, e in errors.items()})

    def _stderr_tail(self, r: int, lines: int = 15) -> str:
        try:
            with open(self._path("err", r), "rb") as f:
                f.seek(max(0, os.fstat(f.fileno()).st_size - 8192))
                text = f.read().decode("utf-8", "replace")
        except OSError:
            return ""
        crash = text.rfind("Fatal Python error")
        if crash >= 0:  # faulthandler's report: the error line and the task's stack
            dump = text[crash:]
            return dump.splitlines()[0] + "\n" + _stacks.format_dump(dump, self.labels)
        return "\n".join(text.splitlines()[-lines:])

    def _load_result(self, r: int):
        with open(self._path("result", r), "rb") as f:
            data = f.read()
        try:
            return _pickling.loads(data)
        except Exception as exc:  # noqa: BLE001
            raise LaunchError(f"rank {r}'s result could not be loaded in the notebook "
                              f"({type(exc).__name__}: {exc})") from None

    # ---------------------------------------------------------------- failures

    def _collect_stacks(self, ranks, wait: float = 2.0) -> dict:
        """Ask each live rank for its Python stack (faulthandler on SIGUSR1)."""
        import signal

        pids = _read_pids(self.dir)
        asked = []
        for r in ranks:
            if r in pids and _procs.same_process(*pids[r]):
                os.kill(pids[r][0], signal.SIGUSR1)
                asked.append(r)
        stacks = {}
        deadline = time.monotonic() + wait
        while asked and time.monotonic() < deadline:
            time.sleep(_POLL)  # faulthandler writes the whole dump at once, in C
            for r in list(asked):
                with open(self._path("stack", r)) as f:
                    dump = f.read()
                if "File " in dump:
                    stacks[r] = dump
                    asked.remove(r)
        return stacks

    def _status(self, stacks: dict, errors: dict) -> dict:
        status = {}
        for r in range(self.nproc):
            if r in errors:
                first_line = (errors[r]["message"].splitlines() or [""])[0]
                short = first_line if len(first_line) <= 100 else first_line[:97] + "..."
                status[r] = f"raised {errors[r]['exc_type']}" + (f": {short}" if short else "")
            elif os.path.exists(self._path("result", r)):
                status[r] = "returned"
            elif r in stacks:
                status[r] = _stacks.where(_stacks.main_thread_frames(stacks[r]), self.labels)
            else:
                status[r] = _NOT_STARTED
        return status

    def _status_lines(self, stacks: dict, errors: dict | None = None) -> str:
        status = self._status(stacks, errors or {})
        return "\n".join(f"  rank {r}: {text}" for r, text in status.items())

    def _fail(self, errors: dict) -> list:
        __tracebackhide__ = True  # IPython hides launcher frames
        stacks = self._collect_stacks(self._unfinished())
        first = min(errors.values(), key=lambda e: e["time"])
        r = first["rank"]
        others = {k: v for k, v in self._status(stacks, errors).items() if k != r}
        lines = [f"rank {r} {'could not start' if first['kind'] in ('init', 'setup') else 'failed'}: "
                 f"{first['exc_type']}: {first['message']}".rstrip(), "",
                 f"Traceback from rank {r}:", first["traceback"].rstrip()]
        if others:
            lines += ["", "The other ranks:"] + [f"  rank {k}: {v}" for k, v in others.items()]
        hint = _hint(first, self.debug)
        if hint:
            lines += ["", hint]
        error = WorkerError("\n".join(lines), rank=r, remote_traceback=first["traceback"],
                            exc_type=first["exc_type"],
                            stacks={k: _stacks.format_dump(v, self.labels) for k, v in stacks.items()},
                            failures={k: f"{e['exc_type']}: {e['message']}" for k, e in errors.items()})
        reason = transient_start_failure(first)
        if reason:
            raise _TransientStartFailure(error, reason)
        raise error

    def _time_out(self) -> list:
        __tracebackhide__ = True  # IPython hides launcher frames
        stacks = self._collect_stacks(self._unfinished())
        status = self._status(stacks, self._errors())
        lines = [f"the launch did not finish within {self.timeout:g} s. Where each rank was:"]
        lines += [f"  rank {r}: {text}" for r, text in status.items()]
        starting = [r for r, v in status.items() if v in (_stacks.STARTING_UP, _NOT_STARTED)]
        if starting and len(starting) == len(self._unfinished()):
            lines += ["", f"The ranks had not finished starting: a cold start takes about 4-10 s, more "
                          f"when many launches share the CPU cores. Raise timeout= (it was {self.timeout:g} s)."]
            raise LaunchTimeout("\n".join(lines), timeout=self.timeout, stacks={}, status=status)
        if any(v == "returned" for v in status.values()):
            lines += ["", "Some ranks returned while others wait: the ranks probably disagree about "
                          "which collectives to call (a collective inside `if rank == ...`, or a "
                          "different number of calls per rank)."]
        if not self.debug:
            lines += ["Rerun with launch(..., debug=True) to have torch name mismatched collectives "
                      "at once; raise timeout= if the work is merely slow."]
        raise LaunchTimeout("\n".join(lines), timeout=self.timeout,
                            stacks={r: _stacks.format_dump(d, self.labels) for r, d in stacks.items()},
                            status=status)


def _exit_codes(agent_log: str) -> dict:
    """rank -> exit code from torchrun's failure summary (negative: killed by that signal)."""
    import re

    pattern = re.compile(r"rank\s*:\s*(\d+)[^\n]*\n\s*exitcode\s*:\s*(-?\d+)")
    return {int(rank): int(code) for rank, code in pattern.findall(agent_log)}


def _describe_exit(code) -> tuple[str, str]:
    """(sentence, short name) for a rank's exit status."""
    import signal

    if code is None:
        return "its exit status is unknown", "died"
    if code >= 0:
        return f"it exited with code {code} (os._exit or sys.exit outside Python's error handling)", \
            f"exit code {code}"
    try:
        name = signal.Signals(-code).name
    except ValueError:
        name = f"signal {-code}"
    why = {"SIGSEGV": "a crash in C/C++ code, e.g. a bad pointer or tensor access",
           "SIGKILL": "often the out-of-memory killer",
           "SIGABRT": "an abort inside a library, e.g. gloo on mismatched message sizes",
           "SIGBUS": "a crash in C/C++ code"}.get(name, "")
    return f"it was killed by {name}" + (f" ({why})" if why else ""), name


class _TransientStartFailure(Exception):
    def __init__(self, error: WorkerError, reason: str):
        super().__init__(reason)
        self.error, self.reason = error, reason


_TRANSIENT_MARKERS = ("connectFullMesh", "Connection closed by peer", "Connection refused",
                      "Connect timeout", "Connection reset by peer")


def transient_start_failure(error: dict) -> str:
    """Why a failure while the process group was forming is worth one retry, or "".

    Under heavy load (many students, 2 cores) gloo's first connections can
    fail before any user code ran.  Starting again is safe then; a failure
    in the user's code is never retried.
    """
    if error["kind"] != "init":
        return ""
    return next((m for m in _TRANSIENT_MARKERS if m in error["message"]), "")


def _hint(error: dict, debug: bool) -> str:
    text = error["message"]
    if "Timed out" in text or "timed out" in text:
        tip = ("Hint: a collective timed out, so the ranks were waiting for each other: usually one "
               "rank skipped a collective or called a different one.")
        return tip if debug else tip + " Rerun with launch(..., debug=True) to name the mismatch."
    if "default process group twice" in text:
        return ("Hint: parlab.launch has already set up the process group on every rank; remove "
                "init_process_group (and destroy_process_group) from the function.")
    if "EOFError" in error["exc_type"] and "input" in error["traceback"]:
        return "Hint: ranks have no keyboard: input() cannot work there. Pass values as arguments."
    if "Connection closed by peer" in text or "Connection reset by peer" in text:
        return ("Hint: another rank left (it returned or crashed) while this rank waited for it in a "
                "collective: every rank must call the same collectives in the same order.")
    if error["kind"] == "setup" and "No module named" in text:
        return ("Hint: the ranks could not import something the function needs. Define it in the "
                "notebook or in a module on the kernel's sys.path.")
    return ""
