"""torchrun, tied to the notebook kernel that started it.

``python -m parlab.launch.agent <torchrun args>`` is plain torchrun plus one thing:
it dies as soon as the kernel does (restart, crash, SIGKILL), and its workers,
which are tied to it the same way, follow within a fraction of a second.
Under srun its parent is slurmstepd (``PARLAB_KERNEL_PID=0``), so it dies
with the Slurm step instead.

``--slurm-rendezvous`` as the first argument stands for the rendezvous of a
launch over several Slurm nodes: the endpoint is the first allocated node's
address, the node rank is ``SLURM_NODEID``, the run id the job id.
"""
from __future__ import annotations

import os
import sys

from parlab.launch.procs import die_with_parent


def slurm_rendezvous() -> list[str]:
    import subprocess

    from parlab.launch.nodes import rendezvous_args

    first = subprocess.run(["scontrol", "show", "hostnames", os.environ["SLURM_JOB_NODELIST"]],
                           capture_output=True, text=True, check=True).stdout.split()[0]
    node = subprocess.run(["scontrol", "show", "node", first, "-o"], capture_output=True, text=True,
                          check=True).stdout
    addr = next((f.split("=", 1)[1] for f in node.split() if f.startswith("NodeAddr=")), first)
    job = int(os.environ["SLURM_JOB_ID"])
    return rendezvous_args(int(os.environ["SLURM_JOB_NUM_NODES"]), int(os.environ["SLURM_NODEID"]),
                           f"{addr}:{29400 + job % 20000}", f"slurm-{job}")


def main(args: list[str] | None = None, parent: int | None = None) -> None:
    """torchrun with ``args`` (default: this command's), dying with ``parent`` (default: the kernel).

    The fork server (``fork_server.py``) calls this in a child it forked: the parent is then the server.
    """
    parent = parent or int(os.environ.get("PARLAB_KERNEL_PID", "0")) or None
    die_with_parent(parent)
    os.environ["PARLAB_AGENT_PID"] = str(os.getpid())  # the workers' expected parent
    from torch.distributed.run import main as torchrun_main

    args = sys.argv[1:] if args is None else list(args)
    if args[:1] == ["--slurm-rendezvous"]:
        args = slurm_rendezvous() + args[1:]
    torchrun_main(args)


if __name__ == "__main__":
    main()
