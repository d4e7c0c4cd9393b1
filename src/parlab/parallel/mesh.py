"""Device meshes: which rank sits at which coordinate of named axes.

``Grid`` is the one model: any number of named axes, outermost first, the
last varying fastest, ranks numbered as ``torch.arange(world).view(*sizes)``
(and as ``init_device_mesh(device_type, sizes, mesh_dim_names=names)``).
Lab 07's expert-parallel mesh is ``Grid.of(dp=2, ep=2)``.  The planner
places its axes on three (``parlab.planner.grid``, ``expert_grid``,
``hsdp_grid``): ``Grid.of(pp=, dp=, cp=, tp=)`` (Megatron-Core's
"tp-cp-dp-pp", fastest first), its expert layers' ``Grid.of(pp=, edp=,
ep=, tp=)`` ("tp-ep-dp-pp", the expert-data-parallel ranks what is left of
dp·cp) and HSDP's ``Grid.of(pp=, replicate=, shard=, cp=, tp=)``
(torchtitan's mesh order).  Lab 06's data-parallel sync check lays its
ranks out as ``Grid.of(dp=, tp=)``.  ``Mesh`` is the lecture's 3-D case,
with named coordinates (p, d, t).

The 3-D mesh's ranks are laid out as ``torch.arange(world).view(pp, dp, tp)``::

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

__all__ = ["AXES", "Coords", "Grid", "Mesh"]

#: The 3-D mesh's axis names, outermost first: the order of its dimensions.
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


def _index(name: str, value, size: int, where) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < size:
        raise ValueError(f"{name} must be an int from 0 to {size - 1} for {where}, got {value!r}")
    return value


@dataclass(frozen=True)
class Grid:
    """Ranks on named axes of the given sizes, outermost first; the last axis varies fastest.

    rank = Σᵢ cᵢ · (nᵢ₊₁ · … · n_last), the index of ``torch.arange(world).view(*sizes)``.

        >>> g = Grid.of(dp=2, ep=2)
        >>> g.groups("ep"), g.groups("dp")
        ([[0, 1], [2, 3]], [[0, 2], [1, 3]])
        >>> g.coords(3), g.stride("dp")
        ({'dp': 1, 'ep': 1}, 2)
    """

    names: tuple[str, ...]
    sizes: tuple[int, ...]

    @classmethod
    def of(cls, **axes: int) -> Grid:
        """The grid with these axes, outermost first in the order given: ``Grid.of(pp=2, dp=4, tp=8)``."""
        return cls(tuple(axes), tuple(axes.values()))

    def __post_init__(self) -> None:
        if not self.names or len(self.names) != len(self.sizes):
            raise ValueError(f"a grid needs one size per axis name, got names {self.names!r} and sizes {self.sizes!r}")
        if len(set(self.names)) != len(self.names):
            raise ValueError(f"axis names must differ, got {self.names!r}")
        for name, size in zip(self.names, self.sizes):
            _size(name, size)

    def __str__(self) -> str:
        return "Grid(" + ", ".join(f"{n}={s}" for n, s in zip(self.names, self.sizes)) + ")"

    @property
    def world_size(self) -> int:
        out = 1
        for size in self.sizes:
            out *= size
        return out

    def axis(self, axis: str) -> int:
        """The position of ``axis`` among the names, outermost 0; a clear error for a name not here."""
        if axis not in self.names:
            raise ValueError(f"axis must be one of {', '.join(map(repr, self.names))}, got {axis!r}")
        return self.names.index(axis)

    def stride(self, axis: str) -> int:
        """How many ranks apart two neighbours along ``axis`` sit: the product of the sizes inside it."""
        out = 1
        for size in self.sizes[self.axis(axis) + 1:]:
            out *= size
        return out

    def coords(self, rank: int) -> dict[str, int]:
        """{axis: index} of ``rank``."""
        _index("rank", rank, self.world_size, self)
        return {name: rank // self.stride(name) % size for name, size in zip(self.names, self.sizes)}

    def rank_of(self, **coords: int) -> int:
        """The rank at these coordinates (every axis named once)."""
        if set(coords) != set(self.names):
            raise ValueError(f"give one coordinate per axis of {self}: {', '.join(self.names)}; got {sorted(coords)}")
        return sum(_index(name, coords[name], size, self) * self.stride(name)
                   for name, size in zip(self.names, self.sizes))

    def group_of(self, rank: int, axis: str) -> list[int]:
        """The ranks that share every coordinate of ``rank`` except ``axis``, in rank order."""
        size, step = self.sizes[self.axis(axis)], self.stride(axis)
        first = rank - self.coords(rank)[axis] * step
        return [first + i * step for i in range(size)]

    def groups(self, axis: str) -> list[list[int]]:
        """Every group along ``axis``, ordered by the group's lowest rank."""
        self.axis(axis)
        return [self.group_of(rank, axis) for rank in range(self.world_size) if self.coords(rank)[axis] == 0]

    def nodes_spanned(self, axis: str, layout) -> int:
        """The most nodes that one group along ``axis`` touches on ``layout`` (1: it stays in a node)."""
        if layout.world_size != self.world_size:
            raise ValueError(f"{layout} holds {layout.world_size} ranks but {self} has {self.world_size}")
        return max(len({layout.node_of(r) for r in group}) for group in self.groups(axis))

    def placement(self, layout) -> dict[str, int]:
        """{axis: nodes_spanned(axis, layout)}: which axes cross nodes, and over how many."""
        return {axis: self.nodes_spanned(axis, layout) for axis in self.names}

    def span(self, axes: tuple[str, ...]) -> int:
        """How many consecutive ranks one group along ``axes`` (one axis, or adjacent axes taken together:
        the ranks that share every other coordinate) runs over, first to last: the stride of the innermost
        of them × their sizes.  A planner compares it with a node's GPUs to say whether the group leaves
        its node without listing the ranks (``nodes_spanned`` lists them).

            >>> Grid.of(pp=2, dp=2, cp=2, tp=4).span(("tp",)), Grid.of(pp=2, dp=2, cp=2, tp=4).span(("dp", "cp"))
            (4, 16)
        """
        idx = sorted(self.axis(a) for a in axes)
        if idx != list(range(idx[0], idx[0] + len(idx))):
            raise ValueError(f"axes must be adjacent in {self}, got {axes!r}")
        out = self.stride(self.names[idx[-1]])
        for i in idx:
            out *= self.sizes[i]
        return out


@dataclass(frozen=True)
class Mesh:
    """A pp × dp × tp mesh of ``pp·dp·tp`` ranks, TP innermost: the ``Grid`` (pp, dp, tp)."""

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

    @property
    def grid(self) -> Grid:
        """This mesh as the general ``Grid`` of axes ``AXES``."""
        return Grid(AXES, self.shape)

    def nodes_spanned(self, axis: str, layout) -> int:
        """The most nodes that one group along ``axis`` touches on ``layout`` (1: it stays in a node)."""
        if layout.world_size != self.world_size:
            raise ValueError(f"{layout} holds {layout.world_size} ranks but {self} has {self.world_size}")
        return self.grid.nodes_spanned(axis, layout)

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
        _index("rank", rank, self.world_size, self)
        return Coords(*self.grid.coords(rank).values())

    def rank_of(self, p: int, d: int, t: int) -> int:
        """The rank at (p, d, t): p·dp·tp + d·tp + t."""
        for name, value, size in (("p", p, self.pp), ("d", d, self.dp), ("t", t, self.tp)):
            _index(name, value, size, self)
        return self.grid.rank_of(pp=p, dp=d, tp=t)

    def group_of(self, rank: int, axis: str) -> list[int]:
        """The ranks that share every coordinate of ``rank`` except ``axis``, in rank order."""
        self.coords(rank)
        return self.grid.group_of(rank, axis)

    def groups(self, axis: str) -> list[list[int]]:
        """Every group along ``axis``, ordered by the group's lowest rank."""
        return self.grid.groups(axis)
