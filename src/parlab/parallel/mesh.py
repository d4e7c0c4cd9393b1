"""The 3-D device mesh: which rank sits at which (pipeline, data, tensor) coordinate.

Ranks are laid out as ``torch.arange(world).view(pp, dp, tp)``::

    rank = p·(dp·tp) + d·tp + t

so the tensor-parallel coordinate varies fastest.  Consecutive ranks share a
node (a launcher numbers the GPUs of one node consecutively), so a TP group
of up to 8 ranks sits inside one NVLink node, where TP's per-layer
all-reduces need the bandwidth.  DP and then PP are the outer axes.  This is
the order of Megatron-LM's rank generator ("tp-dp-pp", fastest first) and of
``init_device_mesh(device_type, (pp, dp, tp), mesh_dim_names=("pp", "dp", "tp"))``,
whose groups the tests compare with these.  picotron's grid,
``arange(world).view(dp, pp, cp, tp)``, also varies TP fastest but puts DP
outermost and PP inside it: the same TP groups, different DP and PP groups.

A *group along an axis* is the set of ranks that share the other two
coordinates: the TP group of rank r holds the ranks with r's p and d.
On a launch's real nodes (``parlab.parallel.node_layout.NodeLayout``, read
from torchrun's or Slurm's variables) ``Mesh.on_nodes`` refuses a TP group
that would leave its node, and ``placement`` says which axes cross nodes.

    >>> m = Mesh(pp=2, dp=2, tp=2)
    >>> m.coords(5)
    Coords(p=1, d=0, t=1)
    >>> m.rank_of(1, 0, 1)
    5
    >>> m.groups("tp")
    [[0, 1], [2, 3], [4, 5], [6, 7]]
    >>> m.group_of(5, "dp")
    [5, 7]
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

__all__ = ["AXES", "Coords", "Mesh"]

#: Axis names, outermost first: the order of the mesh's dimensions.
AXES = ("pp", "dp", "tp")


class Coords(NamedTuple):
    """A rank's position: pipeline stage p, data-parallel replica d, tensor shard t."""

    p: int
    d: int
    t: int


def _size(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive int (1 switches the axis off), got {value!r}")
    return value


@dataclass(frozen=True)
class Mesh:
    """A pp × dp × tp mesh of ``pp·dp·tp`` ranks, TP innermost."""

    pp: int = 1
    dp: int = 1
    tp: int = 1

    def __post_init__(self) -> None:
        for name in AXES:
            _size(name, getattr(self, name))

    @classmethod
    def for_world(cls, world_size: int, *, pp: int = 1, dp: int = 1, tp: int = 1) -> Mesh:
        """The mesh, after checking that its sizes multiply to ``world_size``."""
        world_size = _size("world_size", world_size)
        mesh = cls(pp=pp, dp=dp, tp=tp)
        if mesh.world_size != world_size:
            raise ValueError(f"pp·dp·tp = {pp}·{dp}·{tp} = {mesh.world_size}, but the world size is "
                             f"{world_size}: choose sizes whose product is {world_size}")
        return mesh

    @classmethod
    def on_nodes(cls, layout, *, pp: int = 1, dp: int = 1, tp: int = 1) -> Mesh:
        """The mesh on a launch's nodes (a ``NodeLayout``), after checking that TP stays inside a node.

        ``layout.world_size`` must be pp·dp·tp.  TP's all-reduces block every
        layer, so a TP group that would span two nodes is refused; use
        ``placement`` to see which of the other axes cross nodes.
        """
        mesh = cls.for_world(layout.world_size, pp=pp, dp=dp, tp=tp)
        if mesh.nodes_spanned("tp", layout) > 1:
            raise ValueError(f"tp={tp} crosses nodes on {layout.nnodes} node(s) of {layout.per_node} "
                             f"ranks ({layout.source}): TP's per-layer all-reduces would travel between "
                             f"nodes. Choose a tp that divides {layout.per_node}.")
        return mesh

    def nodes_spanned(self, axis: str, layout) -> int:
        """The most nodes that one group along ``axis`` touches on ``layout`` (1: it stays in a node)."""
        if layout.world_size != self.world_size:
            raise ValueError(f"{layout} holds {layout.world_size} ranks but {self} has {self.world_size}")
        return max(len({layout.node_of(r) for r in group}) for group in self.groups(_axis(axis)))

    def placement(self, layout) -> dict[str, int]:
        """{axis: nodes_spanned(axis, layout)}: which axes cross nodes, and over how many."""
        return {axis: self.nodes_spanned(axis, layout) for axis in AXES}

    @property
    def world_size(self) -> int:
        return self.pp * self.dp * self.tp

    @property
    def shape(self) -> tuple[int, int, int]:
        """(pp, dp, tp): the shape to pass to ``init_device_mesh`` with names ``AXES``."""
        return (self.pp, self.dp, self.tp)

    def coords(self, rank: int) -> Coords:
        """(p, d, t) of ``rank``."""
        if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < self.world_size:
            raise ValueError(f"rank must be an int from 0 to {self.world_size - 1} for {self}, "
                             f"got {rank!r}")
        return Coords(p=rank // (self.dp * self.tp), d=rank // self.tp % self.dp, t=rank % self.tp)

    def rank_of(self, p: int, d: int, t: int) -> int:
        """The rank at (p, d, t): p·dp·tp + d·tp + t."""
        for name, value, size in (("p", p, self.pp), ("d", d, self.dp), ("t", t, self.tp)):
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < size:
                raise ValueError(f"{name} must be an int from 0 to {size - 1} for {self}, got {value!r}")
        return (p * self.dp + d) * self.tp + t

    def group_of(self, rank: int, axis: str) -> list[int]:
        """The ranks that share every coordinate of ``rank`` except ``axis``, in rank order."""
        here = self.coords(rank)._asdict()
        key = _axis(axis)[0]  # "tp" -> "t"
        out = []
        for i in range(getattr(self, axis)):
            here[key] = i
            out.append(self.rank_of(**here))
        return out

    def groups(self, axis: str) -> list[list[int]]:
        """Every group along ``axis``, ordered by the group's lowest rank."""
        seen: dict[int, list[int]] = {}
        for rank in range(self.world_size):
            group = self.group_of(rank, axis)
            seen.setdefault(group[0], group)
        return list(seen.values())


def _axis(axis) -> str:
    if axis not in AXES:
        raise ValueError(f"axis must be one of {', '.join(map(repr, AXES))}, got {axis!r}")
    return axis
