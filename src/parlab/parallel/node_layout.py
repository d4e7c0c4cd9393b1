"""How a launch's ranks sit on its nodes, read from the launch's own environment.

torchrun numbers the ranks node by node: the agent of node ``GROUP_RANK``
starts ``LOCAL_WORLD_SIZE`` ranks, whose global ranks follow those of the
nodes before it (torch.distributed.elastic's agent, ``_assign_worker_ranks``).
With the same number of ranks on every node, rank r therefore sits on node
``r // per_node``.  Inside a rank torchrun sets ``GROUP_WORLD_SIZE`` (the
number of nodes, one agent each), ``LOCAL_WORLD_SIZE`` and ``WORLD_SIZE``.

A process that runs inside a Slurm allocation but outside torchrun (a
kernel started by a batch spawner, a script under ``srun``) has Slurm's
``SLURM_NNODES`` (or ``SLURM_JOB_NUM_NODES``) and ``SLURM_GPUS_ON_NODE``
(Slurm's srun/sbatch "output environment variables") instead.

    >>> layout = NodeLayout.from_env({"WORLD_SIZE": "4", "GROUP_WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2"})
    >>> layout.nnodes, layout.per_node, layout.node_of(3)
    (2, 2, 1)
"""
from __future__ import annotations

import os
from dataclasses import dataclass

__all__ = ["NodeLayout"]


def _count(name: str, value) -> int:
    try:
        number = int(value)
    except (TypeError, ValueError):
        number = 0
    if number < 1 or str(value).strip() != str(number):
        raise ValueError(f"{name}={value!r} is not a positive whole number")
    return number


@dataclass(frozen=True)
class NodeLayout:
    """``nnodes`` nodes of ``per_node`` ranks (GPUs) each, ranks numbered node by node."""

    nnodes: int
    per_node: int
    source: str = "given"

    def __post_init__(self) -> None:
        for name in ("nnodes", "per_node"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")

    @property
    def world_size(self) -> int:
        return self.nnodes * self.per_node

    def node_of(self, rank: int) -> int:
        """The node that holds ``rank``."""
        if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < self.world_size:
            raise ValueError(f"rank must be an int from 0 to {self.world_size - 1} for {self}, got {rank!r}")
        return rank // self.per_node

    @classmethod
    def from_env(cls, env=None) -> NodeLayout | None:
        """The layout torchrun (inside a rank) or Slurm (inside an allocation) gives; None if neither.

        Raises ``ValueError`` when the variables are there but make no even
        layout (nodes of different sizes, or a value that is not a count).
        """
        env = os.environ if env is None else env
        if "GROUP_WORLD_SIZE" in env and "LOCAL_WORLD_SIZE" in env:
            nnodes = _count("GROUP_WORLD_SIZE", env["GROUP_WORLD_SIZE"])
            per_node = _count("LOCAL_WORLD_SIZE", env["LOCAL_WORLD_SIZE"])
            world = _count("WORLD_SIZE", env.get("WORLD_SIZE", nnodes * per_node))
            if world != nnodes * per_node:
                raise ValueError(f"WORLD_SIZE={world} is not GROUP_WORLD_SIZE × LOCAL_WORLD_SIZE = "
                                 f"{nnodes} × {per_node}: the nodes run different numbers of ranks, so a "
                                 "rank's node cannot be told from its number; start the same number on each")
            return cls(nnodes, per_node, f"torchrun: GROUP_WORLD_SIZE={nnodes}, LOCAL_WORLD_SIZE={per_node}")
        key = next((k for k in ("SLURM_NNODES", "SLURM_JOB_NUM_NODES") if k in env), None)
        if key and "SLURM_GPUS_ON_NODE" in env:
            nnodes = _count(key, env[key])
            per_node = _count("SLURM_GPUS_ON_NODE", env["SLURM_GPUS_ON_NODE"])
            return cls(nnodes, per_node, f"Slurm: {key}={nnodes}, SLURM_GPUS_ON_NODE={per_node}")
        return None
