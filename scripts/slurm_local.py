"""A private Slurm cluster on this machine, for the ``slurm`` test tier and the load benchmark.

``python scripts/slurm_local.py start DIR`` writes ``slurm.conf`` and
``gres.conf`` into DIR, starts munged, slurmctld and one or two slurmd (by
pid, with pidfiles in DIR) and waits until ``sinfo`` shows every node idle.
``python scripts/slurm_local.py stop DIR`` stops them by their pidfiles.
The client commands find the cluster through ``SLURM_CONF=DIR/slurm.conf``
(printed by ``start``).

Why dummy device files: slurmd 22.05 refuses a count-only ``gpu`` GRES
("gres/gpu count reported lower than configured (0 < 8)") on a machine with
no GPUs, so gres.conf names eight character devices made with mknod under
DIR/dev.  Slurm only counts them; the ranks run on gloo.

The scheduling settings are the ones docs/jupyterhub.md gives a DGX:
``SelectTypeParameters=CR_Core_Memory`` (memory is a consumable, so a job
that asks none gets ``DefMemPerCPU`` per CPU instead of the whole node),
``DefCpuPerGPU``, ``ProctrackType=proctrack/cgroup`` and
``TaskPlugin=task/cgroup`` with ``ConstrainRAMSpace=yes`` (cgroup v1, which
is what this machine mounts).  Each node claims a scaled-down DGX: 8 GPUs,
``CPUS_PER_GPU`` CPUs and ``MB_PER_GPU`` MB per GPU, the defaults a launch
asks (``parlab.launch.slurm``), accepted by slurmd although this machine
may have fewer cores (``SlurmdParameters=config_overrides``).  What differs
from the DGX recipe, and why:

- ``ConstrainCores=no``: the claimed cores do not all exist here, so a job
  cannot be pinned to them; the CPUs are counted, not enforced.
- ``ConstrainDevices=no``: the dummy GPUs are character devices 1,3 (the
  same numbers as /dev/null); constraining devices would take /dev/null
  away from every job that asks no GPU.
- ``FirstJobId`` is drawn at random: slurmd names a job's cgroup
  ``slurm_NODE/uid_UID/job_ID``, so two private clusters on one machine (two
  test runs at once) must not both count from job 1.  Their ports must
  differ too: ``PARLAB_SLURM_LOCAL_PORT`` moves slurmctld's from 16817 (the
  slurmd take the next ports after port + 183).

With ``--nodes 2`` the two slurmd share the machine and differ by name
and port, so ``srun --nodes 2`` can be tried without a second machine: partition
``gpu`` (the default) is node n1 alone, partition ``two`` both nodes.
"""
from __future__ import annotations

import argparse
import os
import random
import shutil
import signal
import subprocess
import sys
import time

DAEMONS = ("slurmd-n2", "slurmd-n1", "slurmctld", "munged")
GPUS = 8
CPUS_PER_GPU = 2     # = parlab.launch.slurm's default PARLAB_SLURM_CPUS_PER_GPU
MB_PER_GPU = 4096    # = its default PARLAB_SLURM_MEM_PER_GPU (4G)
MB_PER_CPU = MB_PER_GPU // CPUS_PER_GPU


def _conf(dir_: str, nodes: int) -> str:
    port = int(os.environ.get("PARLAB_SLURM_LOCAL_PORT") or 16817)  # the slurmd listen on port+184, port+185
    names = [f"n{i}" for i in range(1, nodes + 1)]
    node_lines = "\n".join(
        f"NodeName={n} NodeHostname={_hostname()} NodeAddr=127.0.0.1 Port={port + 183 + i} CPUs={GPUS * CPUS_PER_GPU} "
        f"RealMemory={GPUS * MB_PER_GPU} Gres=gpu:{GPUS} State=UNKNOWN" for i, n in enumerate(names, 1))
    return f"""\
ClusterName=parlab
SlurmctldHost={_hostname()}(127.0.0.1)
SlurmctldPort={port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={dir_}/munge.socket
StateSaveLocation={dir_}/state
SlurmdSpoolDir={dir_}/spool-%n
SlurmctldPidFile={dir_}/slurmctld.pid
SlurmdPidFile={dir_}/slurmd-%n.pid
SlurmctldLogFile={dir_}/slurmctld.log
SlurmdLogFile={dir_}/slurmd-%n.log
ProctrackType=proctrack/cgroup
TaskPlugin=task/cgroup
SlurmdParameters=config_overrides
FirstJobId={random.randint(1000, 60_000_000)}
MpiDefault=none
SwitchType=switch/none
ReturnToService=2
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
DefMemPerCPU={MB_PER_CPU}
DefCpuPerGPU={CPUS_PER_GPU}
GresTypes=gpu
PriorityType=priority/multifactor
PriorityWeightFairshare=10000
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
KillWait=2
MinJobAge=2
OverTimeLimit=0
InactiveLimit=0
SchedulerParameters=sched_interval=1
MessageTimeout=10
{node_lines}
PartitionName=gpu Nodes=n1 Default=YES MaxTime=60 State=UP OverSubscribe=NO
""" + (f"PartitionName=two Nodes={','.join(names)} MaxTime=60 State=UP OverSubscribe=NO\n" if nodes > 1 else "")


CGROUP_CONF = """\
CgroupPlugin=cgroup/v1
CgroupMountpoint=/sys/fs/cgroup
ConstrainRAMSpace=yes
ConstrainCores=no
ConstrainDevices=no
"""


def _hostname() -> str:
    import socket

    return socket.gethostname().split(".")[0]


def _pid(dir_: str, name: str) -> int | None:
    try:
        with open(os.path.join(dir_, f"{name}.pid")) as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def env(dir_: str) -> dict:
    return {**os.environ, "SLURM_CONF": os.path.join(dir_, "slurm.conf")}


def start(dir_: str, nodes: int = 1, timeout: float = 60.0) -> None:
    for tool in ("munged", "slurmctld", "slurmd", "sinfo"):
        if shutil.which(tool) is None and not os.path.exists(f"/usr/sbin/{tool}"):
            raise SystemExit(f"slurm_local: {tool} is not installed; run "
                             "apt-get install -y slurmctld slurmd slurm-client munge")
    dir_ = os.path.abspath(dir_)
    for sub in ("state", "dev", "munge"):
        os.makedirs(os.path.join(dir_, sub), exist_ok=True)
    for i in range(GPUS):  # the dummy GPUs: character devices 1,3 (like /dev/null) that nothing opens
        path = os.path.join(dir_, "dev", f"gpu{i}")
        if not os.path.exists(path):
            os.mknod(path, 0o600 | 0o020000, os.makedev(1, 3))
    with open(os.path.join(dir_, "slurm.conf"), "w") as f:
        f.write(_conf(dir_, nodes))
    with open(os.path.join(dir_, "cgroup.conf"), "w") as f:  # read from slurm.conf's folder
        f.write(CGROUP_CONF)
    with open(os.path.join(dir_, "gres.conf"), "w") as f:
        f.write(f"Name=gpu File={dir_}/dev/gpu[0-{GPUS - 1}]\n")
    key = os.path.join(dir_, "munge", "munge.key")
    if not os.path.exists(key):
        with open(key, "wb") as f:
            f.write(os.urandom(1024))
        os.chmod(key, 0o400)
    sbin = "/usr/sbin"
    subprocess.run([f"{sbin}/munged", f"--key-file={key}", f"--socket={dir_}/munge.socket",
                    f"--pid-file={dir_}/munged.pid", f"--log-file={dir_}/munged.log",
                    f"--seed-file={dir_}/munge/seed", "--force"], check=True)
    e = env(dir_)
    subprocess.run([f"{sbin}/slurmctld", "-c", "-i"], env=e, check=True)  # clean state, ignore old jobs
    for i in range(1, nodes + 1):
        subprocess.run([f"{sbin}/slurmd", "-N", f"n{i}"], env=e, check=True)
    deadline = time.monotonic() + timeout
    states = ""
    while time.monotonic() < deadline:
        out = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %t"], env=e, capture_output=True, text=True)
        states = out.stdout.strip()
        seen = dict(line.split()[:2] for line in states.splitlines() if len(line.split()) >= 2)
        if len(seen) == nodes and all(state == "idle" for state in seen.values()):
            # the nodes' pidfiles are named after the node (%n)
            print(f"export SLURM_CONF={dir_}/slurm.conf")
            return
        time.sleep(0.5)
    stop(dir_)
    raise SystemExit(f"slurm_local: the nodes did not become idle within {timeout:g} s (sinfo: "
                     f"{states!r}); see {dir_}/slurmd-n1.log and {dir_}/slurmctld.log")


def stop(dir_: str) -> None:
    dir_ = os.path.abspath(dir_)
    for name in DAEMONS:
        pid = _pid(dir_, name)
        if pid is None or not _alive(pid):
            continue
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 10
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("action", choices=("start", "stop"))
    p.add_argument("dir", help="private folder for the configuration, state, logs and pidfiles")
    p.add_argument("--nodes", type=int, default=1, choices=(1, 2))
    a = p.parse_args(argv)
    if a.action == "start":
        start(a.dir, a.nodes)
    else:
        stop(a.dir)


if __name__ == "__main__":
    sys.exit(main())
