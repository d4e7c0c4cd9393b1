"""One launch's processes, from start to clean-up.

``Job.run()`` starts torchrun (``python -m parlab.launch.agent``) in a new
session (one agent per node for ``nnodes > 1``; inside ``srun`` under a
tether for a Slurm launch, see ``slurm.py``), watches the job folder on the kernel's main thread (output,
results, errors, deaths, the deadline), collects the facts when something
ends the launch and hands them to ``report.explain``.  However the launch
ends, every process it started is ended by pid and its folder removed.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time

from ..cores import usable_cores
from . import nodes, procs, slurm
from .errors import LaunchError, WorkerError
from .failures import transient_reason
from .fork_server import ForkedAgent
from .jobdir import JOB_ENV, JobDir, private_jobs_root, sweep_stale_jobs
from .options import LaunchOptions, notebook_sources, pickle_task
from .output import FileTail, make_sink
from .report import Facts, explain, late_exit, parse_agent_log
from .results import decode, decode_plain

_POLL = 0.05
#: Set by the grading sandbox (``parlab.grading.autograde``): JSON ``{"command": [...], "uid": n}``.  A
#: local launch's agent then starts through ``command`` (an operating-system boundary,
#: ``parlab.grading.boundary``), and a rank's pid file is believed only for a process of uid ``uid``,
#: so a rank cannot name another process for the launcher to signal.
WRAPPER_ENV = "PARLAB_AGENT_WRAPPER"
#: How long to wait for a rank that is writing its outcome (``ending.r`` exists).
_SETTLE = 3.0


class _Transient(Exception):
    def __init__(self, error: WorkerError, reason: str):
        super().__init__(reason)
        self.error, self.reason = error, reason


class Job:
    def __init__(self, task, *options, **named):
        """``options``: one ``LaunchOptions``, already checked; or launch()'s option values from
        ``nproc`` on (positional or by name), which are checked here by building one."""
        if len(options) == 1 and not named and isinstance(options[0], LaunchOptions):
            self.options = options[0]
        else:
            self.options = LaunchOptions(*options, **named)
        o = self.options
        self.scheduler, self.request, self.nnodes = o.scheduler, o.request, o.nnodes
        self.nproc, self.backend, self.timeout, self.debug = o.nproc, o.backend, o.timeout, o.debug
        self.extra_env, self.seed, self.plain_results = dict(o.env), o.seed, o.plain_results
        self.task_bytes = pickle_task(task)
        self.sources, self.labels = notebook_sources()
        self.agent = None
        self.job = None
        self.sink = None
        self.wrapper = json.loads(os.environ[WRAPPER_ENV]) if os.environ.get(WRAPPER_ENV) else None

    # ---------------------------------------------------------------- life cycle

    def run(self) -> list:
        __tracebackhide__ = True  # IPython hides launcher frames
        for attempt in (1, 2):
            sweep_stale_jobs()
            try:
                self._start()
                return self._wait()
            except _Transient as failure:
                if attempt == 2:
                    raise failure.error from None
                self.sink.notice(f"parlab: the ranks could not connect to each other ({failure.reason}); "
                                 "starting them once more")
            except KeyboardInterrupt:
                where = self._facts(stop_ranks=True, settle=0.0, stack_wait=0.5)  # the stop button answers fast
                if where.stacks:
                    from .report import status

                    lines = [f"  rank {r}: {t}" for r, t in status(where).items()]
                    (self.sink or _stderr_sink()).notice(
                        "Interrupted. Where the ranks were:\n" + "\n".join(lines), error=True)
                raise
            finally:
                self._end()
        raise AssertionError("unreachable")

    def _start(self) -> None:
        self.agent, self.job, self.sink = None, None, None
        self._host_pid = {}  # a new launch, new ranks
        spec = {
            "backend": self.backend,
            "pg_timeout": max(1.0, self.timeout / 2),
            "seed": self.seed,
            "sys_path": [os.getcwd()] + [p for p in sys.path if p],
            "sources": self.sources,
            "cell_labels": self.labels,
            "plain_results": self.plain_results,
        }
        self.job = JobDir.create(private_jobs_root(), self.task_bytes, spec)
        self.tails = [(r, s, FileTail(self.job.file(s, r))) for r in range(self.nproc) for s in ("out", "err")]
        self.sink = make_sink(self.nproc)
        per_node = self.nproc // self.nnodes
        worker = [f"--nproc-per-node={per_node}", "--max-restarts=0", "-m", "parlab.launch.worker",
                  self.job.path]
        agent = [sys.executable, "-m", "parlab.launch.agent"]
        self.agent_log = open(self.job.agent_log, "wb")
        self.started = time.monotonic()
        self.running = self.request is None  # a Slurm launch first waits in the queue
        self._next_queue_look = self._queue_next_say = 0.0
        self._queue_said = None
        env = self._env()
        if self.request is not None:
            self.slurm_name = slurm.job_name(self.job.path)
            where = ["--standalone"] if self.nnodes == 1 else ["--slurm-rendezvous"]
            cmd = [sys.executable, "-m", "parlab.launch.slurm_tether", self.slurm_name] + \
                slurm.srun_command(self.request, self.slurm_name, agent + where + worker)
            env.update({"PARLAB_TETHER_OWNER": env["PARLAB_KERNEL_PID"], "PARLAB_KERNEL_PID": "0"})
            self.agent = self._popen(cmd, env)
        elif self.nnodes == 1:
            self.agent = self._forked(env, per_node) or \
                self._popen((self.wrapper or {}).get("command", []) + agent + ["--standalone"] + worker, env)
        else:
            endpoint = f"127.0.0.1:{nodes.free_port()}"
            run_id = os.path.basename(self.job.path)
            self.agent = nodes.AgentGroup([
                self._popen(agent + nodes.rendezvous_args(self.nnodes, i, endpoint, run_id) + worker, env)
                for i in range(self.nnodes)])
        self.agent_token = procs.start_time(self.agent.pid)
        self.deadline = self.started + self.timeout

    def _forked(self, env: dict, per_node: int):
        """torchrun forked by this kernel's fork server (``fork_server.py``), or None to start it cold.

        The same torchrun command, with torchrun's own ``--start-method=forkserver --run-path`` so that
        the ranks are forked too (from multiprocessing's fork server, started by the agent).  Not in a grading box, nor for the MPI backend.
        """
        if self.wrapper is not None or self.backend not in ("gloo", "nccl"):
            return None
        from . import fork_server, worker

        argv = ["--standalone", f"--nproc-per-node={per_node}", "--max-restarts=0", "--start-method=forkserver",
                "--run-path", os.path.abspath(worker.__file__), self.job.path]
        return fork_server.start_agent(argv, env, os.getcwd(), self.job.agent_log)

    def _popen(self, cmd, env) -> subprocess.Popen:
        return subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, stdout=self.agent_log,
                                stderr=subprocess.STDOUT, start_new_session=True)

    def _pids(self) -> dict:
        """The ranks' pid files; under a wrapper only those naming a process of the boxed uid.

        A wrapper whose box has a pid namespace of its own (``"pid_namespace"``)
        writes the pids it sees there: each is mapped to this side's pid among
        the agent's descendants, and one that maps to none is ignored.
        """
        pids = self.job.pids()
        if self.wrapper is not None:
            if self.wrapper.get("pid_namespace"):
                pids = self._host_pids(pids)
            pids = {r: p for r, p in pids.items() if _uid_of(p[0]) == self.wrapper["uid"]}
        return pids

    def _host_pids(self, pids: dict) -> dict:
        """The ranks' (pid in their box, token) as (pid here, token); /proc is read only for new ones."""
        known = self._host_pid  # (pid in the box, token) -> pid here, for this launch
        if any(p not in known for p in pids.values()):
            here = procs.namespace_pids(self.agent.pid)
            known.update({(pid, token): here[pid] for pid, token in pids.values() if pid in here})
        return {r: (known[p], p[1]) for r, p in pids.items() if p in known}

    def _agents(self) -> list:
        return getattr(self.agent, "agents", [self.agent])

    def _watch_queue(self) -> None:
        """While the Slurm job waits: say why, keep the deadline off, notice when it starts."""
        now = time.monotonic()
        if self._pids():
            self.running = True
        elif now >= self._next_queue_look:
            self._next_queue_look = now + 1.0
            jobid, state, reason, position = slurm.queue_state(self.slurm_name)
            said = (reason, position)
            if state == "PENDING" and (said != self._queue_said or now >= self._queue_next_say):
                self._queue_said, self._queue_next_say = said, now + 15.0  # on change, else every 15 s
                self.sink.show_progress(slurm.waiting_text(jobid, reason, position, now - self.started))
            self.running = state not in ("", "PENDING")
        if self.running:
            self.started = now
            self.deadline = now + self.timeout
        else:
            self.deadline = now + self.timeout

    def _env(self) -> dict:
        env = dict(os.environ)
        threads = str(max(1, usable_cores() // self.nproc))
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
            JOB_ENV: self.job.path,
            "PYTHONUNBUFFERED": "1",
            "TMPDIR": self.job.tmp,  # torchrun's torchelastic_* folder lands here
        })
        return env

    def _end(self) -> None:
        """End every process of this launch by pid, then remove its folder.

        A second press of the stop button must not cut the clean-up short, so
        SIGINT waits until it is done (only the main thread may do this).
        """
        guard = threading.current_thread() is threading.main_thread()
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN) if guard else None
        try:
            self._end_processes()
        finally:
            if guard:
                signal.signal(signal.SIGINT, previous)

    def _end_processes(self) -> None:
        if self.agent is not None and self.request is not None:
            slurm.cancel(self.slurm_name)  # waiting or running; the tether's srun then ends
            try:
                self.agent.wait(timeout=20)
            except subprocess.TimeoutExpired:
                pass
        if self.agent is not None:
            agents = {(a.pid, procs.start_time(a.pid)) for a in self._agents() if a.poll() is None}
            ranks = set(self._pids().values())
            ranks |= set(procs.processes_with_env(JOB_ENV, self.job.path))  # e.g. a rank's children
            if isinstance(self.agent, ForkedAgent):  # a subreaper: whatever a forked rank left is below it
                ranks |= set(procs.descendants(self.agent.pid))
            if self.request is None and self.wrapper is None:
                # The ranks first; then torchrun, which has nothing left to do, is killed: its graceful
                # exit (tearing torch down) took 1.2-1.7 s on a loaded machine, up to the 2 s grace,
                # and the stop button waited for it (measured: docs/launcher.md, "The stop button").
                procs.end_processes(list(ranks - agents))
                for pid, token in agents:
                    procs.signal_group(pid, token, signal.SIGKILL)
            else:  # Slurm's tether and the grading box's wrapper end what they hold themselves
                procs.end_processes(list(ranks | agents))
            if self.request is not None and not slurm.wait_gone(self.slurm_name):
                self.sink.notice(f"parlab: Slurm still lists job {self.slurm_name} after scancel; "
                                 "check `squeue --me`", error=True)
            try:
                self.agent.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.agent.kill()
                self.agent.wait()
            self.agent_log.close()
            self._pump(final=True)
            self.sink.finish(time.monotonic() - self.started)
        if self.job is not None:
            shutil.rmtree(self.job.path, ignore_errors=True)

    # ---------------------------------------------------------------- watching

    def _pump(self, final: bool = False) -> None:
        for rank, stream, tail in self.tails:
            for line in tail.read_lines(final):
                self.sink.line(rank, stream, line)

    def _dead_ranks(self, pids: dict) -> list[int]:
        """Ranks whose process ended without a result or an error report: crashed or exited."""
        return sorted(r for r, p in pids.items() if not self.job.finished(r) and not procs.same_process(*p))

    def _all_returned_and_gone(self, pids: dict) -> bool:
        """Every rank wrote its result and its process has ended."""
        return len(pids) == self.nproc and all(self.job.has("result", r) and not procs.same_process(*pids[r])
                                                for r in range(self.nproc))

    def _wait(self) -> list:
        __tracebackhide__ = True  # IPython hides launcher frames
        timed_out = False
        while True:
            if not self.job.exists():
                raise LaunchError(f"the launch's folder {self.job.path} was removed while it ran (by "
                                  "another program cleaning the temporary folder?); run the cell again.")
            self._pump()
            if not self.running:
                self._watch_queue()
            if self.running:
                self.sink.progress(time.monotonic() - self.started,
                                   [r for r in range(self.nproc) if self.job.finished(r)])
            pids = self._pids()
            if self.agent.poll() is not None or self._dead_ranks(pids) or self.job.errors(self.nproc):
                break
            if self._all_returned_and_gone(pids):
                try:  # torchrun notices within its monitor interval; its exit status tells of a bad exit
                    self.agent.wait(timeout=2)
                except subprocess.TimeoutExpired:
                    pass  # a forked rank's own child holds torchrun's pipe to it: the ranks are done
                break
            if time.monotonic() > self.deadline:
                timed_out = True
                break
            time.sleep(_POLL)
        if self.request is not None and not timed_out and not self.job.errors(self.nproc):
            try:  # srun's last lines say whether Slurm itself ended the step
                self.agent.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
        facts = self._facts(timed_out=timed_out)
        error = self._ended_by_slurm(facts) or explain(facts)
        if error is None:
            note = late_exit(facts)
            if note:
                print(note, file=sys.stderr)
            return [self._load_result(r) for r in range(self.nproc)]
        if isinstance(error, WorkerError):
            reason = transient_reason(error.phase, error.failures.get(error.rank, ""))
            if reason:
                raise _Transient(error, reason)
        raise error

    def _ended_by_slurm(self, f: Facts) -> WorkerError | None:
        why = slurm.ended_by_slurm(self.job.agent_text()) if self.request is not None else ""
        missing = [r for r in range(self.nproc) if r not in f.returned]
        if not why or not missing:
            return None
        limit = f" (time_limit={self.request.time_limit / 60:g} min)" if "time limit" in why else ""
        return WorkerError(f"Slurm ended job {self.slurm_name}: {why}{limit}, while rank(s) {missing} "
                           "were running; they were stopped with it. Ask for a longer time_limit, or "
                           "run the cell again.", rank=missing[0], exc_type="ended by Slurm",
                           phase="died", blamed=tuple(missing))

    # ---------------------------------------------------------------- facts

    def _facts(self, timed_out: bool = False, stop_ranks: bool = False, settle: float = _SETTLE,
               stack_wait: float = 2.0) -> Facts:
        """Everything ``report.explain`` needs, read once the ranks that are ending have ended."""
        job = self.job
        f = Facts(nproc=self.nproc, timeout=self.timeout, debug=self.debug, labels=self.labels,
                  timed_out=timed_out, agent_pid=self.agent.pid if self.agent else 0)
        if job is None or self.agent is None:
            return f
        self._settle(settle)
        pids = self._pids()
        f.dead = self._dead_ranks(pids)
        running = [r for r in range(self.nproc) if not job.finished(r) and r not in f.dead]
        if (f.dead or job.errors(self.nproc) or timed_out or stop_ranks) and running:
            f.stacks = self._collect_stacks(running, pids, stack_wait)
        if f.dead:
            try:  # torchrun notices within a moment and writes each rank's exit status
                self.agent.wait(timeout=3)
            except subprocess.TimeoutExpired:
                pass
        f.agent_code = self.agent.poll()
        f.errors = job.errors(self.nproc)  # read again: ranks may have finished writing meanwhile
        f.returned = {r for r in range(self.nproc) if job.has("result", r)}
        f.stacks = {r: d for r, d in f.stacks.items() if r not in f.errors and r not in f.returned}
        self._pump(final=True)
        f.stderr = {r: job.read_text("err", r, last_bytes=8192) for r in f.dead}
        log = job.agent_text()
        f.exit_codes, f.root_cause = parse_agent_log(log)
        f.agent_log = "\n".join(log.splitlines()[-25:])
        return f

    def _settle(self, limit: float) -> None:
        """Wait (briefly) for ranks that left the task and are writing their result or error."""
        deadline = time.monotonic() + limit
        while time.monotonic() < deadline:
            pids = self._pids()
            writing = [r for r in range(self.nproc) if self.job.has("ending", r) and not self.job.finished(r)
                       and r in pids and procs.same_process(*pids[r])]
            if not writing:
                return
            time.sleep(_POLL)

    def _collect_stacks(self, ranks, pids: dict, wait: float) -> dict:
        """Ask each live rank for its Python stack (faulthandler on SIGUSR1)."""
        asked = []
        for r in ranks:
            if r in pids and procs.same_process(*pids[r]):
                os.kill(pids[r][0], signal.SIGUSR1)
                asked.append(r)
        stacks = {}
        deadline = time.monotonic() + wait
        while asked and time.monotonic() < deadline:
            time.sleep(_POLL)  # faulthandler writes the whole dump at once, in C
            for r in list(asked):
                dump = self.job.read_text("stack", r)
                if "File " in dump:
                    stacks[r] = dump
                    asked.remove(r)
        return stacks

    def _load_result(self, r: int):
        try:
            data = self.job.read_bytes("result", r)
        except OSError as exc:  # gone, or a link or FIFO a rank put in its place (parlab.plainfile)
            raise LaunchError(f"rank {r}'s result could not be read in the notebook ({exc})") from None
        try:
            return decode_plain(data) if self.plain_results else decode(data)
        except Exception as exc:  # noqa: BLE001
            raise LaunchError(f"rank {r}'s result could not be loaded in the notebook "
                              f"({type(exc).__name__}: {exc})") from None


def _uid_of(pid: int) -> int | None:
    try:
        return os.stat(f"/proc/{pid}").st_uid  # Linux: the owner of /proc/PID is the process's uid
    except OSError:
        return None


def _stderr_sink():
    from .output import TextSink

    return TextSink(1)
