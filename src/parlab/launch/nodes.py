"""Several torchrun agents as one: a launch over ``nnodes`` nodes.

Each node runs one torchrun agent; the agents meet at a c10d rendezvous
(the first agent to bind the endpoint's port holds the store, the others
join it) and torchrun numbers the nodes (``GROUP_RANK``) and their ranks
(``LOCAL_RANK``).  Locally the "nodes" are agents on this machine; under
Slurm srun starts one agent per allocated node (``agent.py`` reads the
endpoint from the allocation).

``AgentGroup`` answers ``poll``/``wait``/``kill`` like one ``Popen``, so the
launch's watcher treats one agent and many alike: the group has ended when
every agent has, or as soon as one fails, which ends the launch and with it
every other node's ranks.
"""
from __future__ import annotations

import socket
import subprocess
import time


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rendezvous_args(nnodes: int, node_rank: int, endpoint: str, run_id: str) -> list[str]:
    return [f"--nnodes={nnodes}", f"--node-rank={node_rank}", "--rdzv-backend=c10d",
            f"--rdzv-endpoint={endpoint}", f"--rdzv-id={run_id}"]


class AgentGroup:
    def __init__(self, agents: list[subprocess.Popen]):
        self.agents = agents
        self.pid = agents[0].pid
        self.returncode = None

    def poll(self):
        codes = [a.poll() for a in self.agents]
        failed = [c for c in codes if c not in (None, 0)]
        if failed:
            self.returncode = failed[0]
        elif all(c == 0 for c in codes):
            self.returncode = 0
        return self.returncode

    def wait(self, timeout=None):
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired("torchrun agents", timeout)
            time.sleep(0.05)
        return self.returncode

    def kill(self):
        for a in self.agents:
            if a.poll() is None:
                a.kill()
        for a in self.agents:
            a.wait()
