"""Launches that wait in a Slurm queue for GPUs that this server does not hold.

``launch(fn, gpus=8, scheduler="slurm")`` runs torchrun inside an
interactive Slurm allocation: ``srun`` asks for the GPUs as generic
resources (GRES), with CPUs and memory per GPU, waits in the queue, then
starts one torchrun agent per node, which starts the ranks as a local
launch does.

Only a launch that passes ``scheduler="slurm"`` goes to the queue.
``PARLAB_SCHEDULER=slurm``, set for a hub's servers, does not reroute
anything by itself: it turns on the labs' queue cells (``queue_offer.py``),
which then pass ``scheduler="slurm"``.  The doctor, warm groups, exercises,
visible checks and grading keep running on the server's own CPUs/GPUs.

What each launch asks per node, for each GPU it asks (for each rank when it
asks no GPU): ``PARLAB_SLURM_CPUS_PER_GPU`` CPUs (default 2) and
``PARLAB_SLURM_MEM_PER_GPU`` memory (default 4G; Slurm's size suffixes
K, M, G, T, a bare number is MB).  The defaults suit the labs' small
models; a DGX H100 has 14 cores and 256 GB per GPU for real work.

Why ``srun`` and not submitit or ``sbatch``: srun streams the step's output
back as it happens, needs nothing beyond the Slurm client the site already
installs, and its job ends with the step, so a launch never leaves a batch
job behind.  The ranks still write into the launch's folder, so output,
results, errors and stacks travel exactly as in a local launch; that folder
must therefore be visible on the compute node, and the launcher checks the
ranks by pid: today that means the compute node is the machine the notebook
server runs on (a hub on the DGX itself).  A shared launch folder and a
host-aware liveness check for remote nodes are not built yet.

Everything here runs the Slurm client commands (``sinfo``, ``squeue``,
``scancel``, ``srun``); it never talks to slurmctld directly.
"""
from __future__ import annotations

import math
import os
import re
import shutil
import subprocess
from dataclasses import dataclass

from .errors import LaunchError
from .numbers import whole

SCHEDULERS = ("local", "slurm")
#: What slurmstepd prints when Slurm itself ends a running step.
ENDED_BY_SLURM = {"DUE TO TIME LIMIT": "it reached its time limit",
                  "DUE TO PREEMPTION": "it was preempted by a job of higher priority",
                  "DUE TO NODE FAILURE": "its node failed",
                  "DUE TO JOB REQUEUE": "it was requeued"}


@dataclass(frozen=True)
class SlurmRequest:
    """What one launch asks Slurm for (checked against ``sinfo`` before it is queued)."""

    partition: str | None
    account: str | None
    gpus_per_node: int
    nnodes: int
    time_limit: int | None  # seconds (asked for in minutes, Slurm's unit); None: the partition's default
    cpus_per_node: int = 1
    mem_mb_per_node: int = 0  # 0: Slurm's default (DefMemPerCPU)


def choose_scheduler(scheduler, source: str = "scheduler") -> str:
    """The scheduler a launch runs under: "local" unless it passes ``scheduler="slurm"``.

    ``PARLAB_SCHEDULER`` is not read here (see the module docstring): it only
    turns on the labs' queue cells, through ``queue_offer.queue_configured``.
    """
    if scheduler is None:
        return "local"
    if not isinstance(scheduler, str) or scheduler.lower() not in SCHEDULERS:
        raise ValueError(f"{source} must be one of {', '.join(SCHEDULERS)}, got {scheduler!r}")
    return scheduler.lower()


_MEM_UNITS = {"K": 1 / 1024, "M": 1, "G": 1024, "T": 1024 * 1024}


def mem_mb(text, source: str) -> int:
    """A Slurm memory size ("4G", "512M", "2048": MB) in MB; ValueError naming ``source`` otherwise."""
    found = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?)B?\s*", str(text), flags=re.I)
    mb = math.ceil(float(found.group(1)) * _MEM_UNITS[found.group(2).upper() or "M"]) if found else 0
    if mb < 1:
        raise ValueError(f"{source} must be a memory size such as 4G, 512M or 2048 (MB), got {text!r}")
    return mb


def per_gpu_request() -> tuple[int, int]:
    """(CPUs, MB) per GPU from PARLAB_SLURM_CPUS_PER_GPU and PARLAB_SLURM_MEM_PER_GPU (defaults 2 and 4G)."""
    cpus = os.environ.get("PARLAB_SLURM_CPUS_PER_GPU") or "2"
    if not cpus.strip().isdigit() or int(cpus) < 1:
        raise ValueError(f"PARLAB_SLURM_CPUS_PER_GPU must be a whole number of CPUs, at least 1, got {cpus!r}")
    return int(cpus), mem_mb(os.environ.get("PARLAB_SLURM_MEM_PER_GPU") or "4G", "PARLAB_SLURM_MEM_PER_GPU")


def check_nnodes(nnodes) -> int:
    return 1 if nnodes is None else whole("nnodes", nnodes, 1)


def _client(tool: str) -> str:
    path = shutil.which(tool)
    if path is None:
        raise LaunchError(f"scheduler='slurm' needs the Slurm client command {tool!r}, which is not on "
                          "PATH. Install the Slurm client (Debian: apt-get install slurm-client munge), "
                          "or leave out scheduler='slurm' to run on this server's own CPUs/GPUs.")
    return path


def run_client(args: list[str], timeout: float = 15.0) -> str:
    """Run a Slurm client command and return its stdout; a failure names the command and what to set."""
    cmd = [_client(args[0])] + args[1:]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                             stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        out = None
    if out is None or out.returncode != 0:
        said = "no answer within %g s" % timeout if out is None else (out.stderr.strip() or
                                                                       f"exit code {out.returncode}")
        raise LaunchError(f"`{' '.join(args)}` failed: {said}. The Slurm controller (slurmctld) is not "
                          "reachable from this server: check SLURM_CONF (or /etc/slurm/slurm.conf) names "
                          "the controller, that munged runs with the cluster's munge key, and that "
                          "`sinfo` works in a terminal; or leave out scheduler='slurm' to run locally.")
    return out.stdout


def _partitions() -> dict[str, dict]:
    """partition -> {"gpus", "cpus", "mem": per node, "nodes": names, "default": bool} from sinfo."""
    found: dict[str, dict] = {}
    for line in run_client(["sinfo", "-h", "-N", "-o", "%P|%N|%G|%c|%m"]).splitlines():
        part, node, gres, cpus, mem = (line.split("|") + ["", "", "", ""])[:5]
        default = part.endswith("*")
        part = part.rstrip("*")
        gpus = sum(int(m.group(1)) for m in re.finditer(r"gpu(?::[\w.-]+)?:(\d+)", gres))
        p = found.setdefault(part, {"gpus": [], "cpus": [], "mem": [], "nodes": set(), "default": default})
        if node not in p["nodes"]:
            p["nodes"].add(node)
            p["gpus"].append(gpus)
            p["cpus"].append(int(cpus) if cpus.strip().isdigit() else 0)
            p["mem"].append(int(mem) if mem.strip().isdigit() else 0)
    return found


def check_request(nproc, gpus, nnodes, partition, account, time_limit,
                  per_gpu: bool = True) -> tuple[int, SlurmRequest]:
    """(ranks, request) once Slurm has confirmed the partition can hold it; raises before queuing.

    ``per_gpu=False`` leaves out the CPUs and memory per GPU (``parlab grade --slurm`` asks its own).
    """
    nnodes = check_nnodes(nnodes)
    if partition is None:
        partition = os.environ.get("PARLAB_SLURM_PARTITION") or None
    if account is None:
        account = os.environ.get("PARLAB_SLURM_ACCOUNT") or None
    gpus = 0 if gpus is None else whole("gpus", gpus, 0)
    if nproc is None:
        nproc = gpus or 2 * nnodes
    nproc = whole("nproc", nproc, 1)
    if nproc % nnodes or gpus % nnodes:
        raise ValueError(f"nproc={nproc} and gpus={gpus} must split evenly over nnodes={nnodes} "
                         "(each node runs the same number of ranks)")
    if time_limit is not None:
        if isinstance(time_limit, bool) or not isinstance(time_limit, (int, float)) \
                or not math.isfinite(time_limit) or time_limit <= 0:
            raise ValueError(f"time_limit must be a positive number of minutes, got {time_limit!r}")
        time_limit = max(1, math.ceil(time_limit * 60))
    cpus_per_gpu, mb_per_gpu = per_gpu_request() if per_gpu else (0, 0)
    parts = _partitions()
    if partition is None:
        partition = next((name for name, p in parts.items() if p["default"]), None)
    if partition not in parts:
        raise ValueError(f"Slurm has no partition {partition!r}; sinfo lists {', '.join(sorted(parts)) or 'none'}."
                         " Pass partition=... or set PARLAB_SLURM_PARTITION.")
    p = parts[partition]
    per_node = gpus // nnodes
    if nnodes > len(p["nodes"]):
        raise ValueError(f"nnodes={nnodes} but partition {partition!r} has {len(p['nodes'])} node(s)")
    fits = sorted(p["gpus"], reverse=True)[:nnodes]
    if per_node > min(fits):
        total = sum(p["gpus"])
        raise ValueError(f"gpus={gpus} over {nnodes} node(s) is more than partition {partition!r} holds "
                         f"({max(p['gpus'])} GPU(s) on its largest node, {total} in all); it would wait "
                         "forever. Ask for fewer GPUs, or more nodes.")
    units = per_node or nproc // nnodes  # GPUs on each node, or ranks when no GPU is asked
    cpus, mb = max(1, units * cpus_per_gpu), units * mb_per_gpu
    what = f"{units} {'GPU' if per_node else 'rank'}(s) per node"
    if max(p["cpus"], default=0) and cpus > max(p["cpus"]):
        raise ValueError(f"{what} at PARLAB_SLURM_CPUS_PER_GPU={cpus_per_gpu} ask {cpus} CPUs, but the nodes "
                         f"of partition {partition!r} have at most {max(p['cpus'])}; it would wait forever. "
                         "Lower PARLAB_SLURM_CPUS_PER_GPU, or ask for fewer GPUs per node.")
    if p["mem"] and max(p["mem"]) and mb > max(p["mem"]):
        raise ValueError(f"{what} at PARLAB_SLURM_MEM_PER_GPU={mb_per_gpu}M ask {mb} MB, but the nodes of "
                         f"partition {partition!r} have at most {max(p['mem'])} MB; it would wait forever. "
                         "Lower PARLAB_SLURM_MEM_PER_GPU, or ask for fewer GPUs per node.")
    return nproc, SlurmRequest(partition, account, per_node, nnodes, time_limit, cpus, mb)


def job_name(job_path: str) -> str:
    """A name unique to one launch (its folder), so squeue and scancel find exactly its job."""
    return "parlab-" + os.path.basename(job_path)


def srun_command(req: SlurmRequest, name: str, command: list[str]) -> list[str]:
    cmd = [_client("srun"), f"--job-name={name}", f"--nodes={req.nnodes}", f"--ntasks={req.nnodes}",
           "--ntasks-per-node=1", "--kill-on-bad-exit=1", "--export=ALL", "--unbuffered",
           f"--partition={req.partition}"]
    if req.gpus_per_node:
        cmd.append(f"--gres=gpu:{req.gpus_per_node}")
    cmd.append(f"--cpus-per-task={req.cpus_per_node}")  # one task per node: the torchrun agent and its ranks
    if req.mem_mb_per_node:
        cmd.append(f"--mem={req.mem_mb_per_node}M")  # per node
    if req.account:
        cmd.append(f"--account={req.account}")
    if req.time_limit:
        cmd.append(f"--time={req.time_limit // 60}:{req.time_limit % 60:02d}")  # minutes:seconds
    return cmd + command


def queue_state(name: str) -> tuple[str, str, str, int]:
    """(job id, state, reason, position among the partition's pending jobs) of the launch's job.

    ("", "", "", 0) when Slurm has no such job (not yet submitted, or gone).
    """
    try:
        mine = run_client(["squeue", "-h", "--name", name, "-o", "%i|%T|%r|%P"], timeout=5).strip()
    except LaunchError:
        return "", "", "", 0
    if not mine:
        return "", "", "", 0
    jobid, state, reason, part = (mine.splitlines()[0].split("|") + ["", "", ""])[:4]
    position = 0
    if state == "PENDING":
        try:
            order = run_client(["squeue", "-h", "-p", part, "-t", "PD", "--sort=-p,i", "-o", "%i"],
                               timeout=5).split()
            position = order.index(jobid) + 1 if jobid in order else 0
        except LaunchError:
            pass
    return jobid, state, reason, position


def cancel(name: str) -> None:
    """scancel the launch's job (waiting or running); quiet when it is already gone."""
    user = os.environ.get("USER") or _user()
    try:
        run_client(["scancel", "--name", name, "--user", user], timeout=10)
    except LaunchError:
        pass


def _user() -> str:
    import pwd

    return pwd.getpwuid(os.getuid()).pw_name


def wait_gone(name: str, limit: float = 20.0) -> bool:
    """Wait until squeue no longer lists the launch's job; True if it is gone."""
    import time

    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        if not queue_state(name)[0]:
            return True
        time.sleep(0.2)
    return False


def ended_by_slurm(log: str) -> str:
    """Why Slurm ended the step ("it reached its time limit"), from srun's output, or ""."""
    return next((why for mark, why in ENDED_BY_SLURM.items() if mark in log), "")


def waiting_text(jobid: str, reason: str, position: int, waited: float) -> str:
    where = f"position {position} in the queue" if position else "in the queue"
    why = {"Resources": "waiting for GPUs that other jobs hold",
           "Priority": "jobs of higher priority go first",
           "None": "being scheduled"}.get(reason, reason or "being scheduled")
    return f"parlab: Slurm job {jobid} waits, {where} ({reason}: {why}), {waited:.0f} s so far"
