"""parlab.parallel.mesh: the pure rank <-> (p, d, t) mapping, checked against
``torch.arange(world).view(pp, dp, tp)`` (the same layout ``init_device_mesh``
builds; tests/ranks/test_mesh_device.py compares with its process groups), and
which axes cross nodes on a launch's real nodes (``NodeLayout``; the ranks of
a real two-agent launch read theirs in tests/ranks/test_launch_multinode.py)."""
import itertools

import pytest
import torch

from parlab.parallel.mesh import AXES, Coords, Grid, Mesh
from parlab.parallel.node_layout import NodeLayout

pytestmark = [pytest.mark.unit, pytest.mark.timeout(60)]

SHAPES = [(1, 1, 1), (2, 2, 2), (1, 2, 4), (2, 1, 4), (4, 2, 1), (3, 2, 5), (1, 2, 8), (2, 4, 8)]


@pytest.mark.parametrize("shape", SHAPES)
def test_coords_and_rank_of_match_arange_view(shape):
    pp, dp, tp = shape
    grid = torch.arange(pp * dp * tp).view(pp, dp, tp)
    mesh = Mesh(pp=pp, dp=dp, tp=tp)
    assert mesh.world_size == grid.numel() and mesh.shape == shape
    for p, d, t in itertools.product(range(pp), range(dp), range(tp)):
        rank = int(grid[p, d, t])
        assert mesh.rank_of(p, d, t) == rank
        assert mesh.coords(rank) == Coords(p, d, t)


@pytest.mark.parametrize("shape", SHAPES)
def test_groups_are_the_ranks_that_share_the_other_coordinates(shape):
    grid = torch.arange(shape[0] * shape[1] * shape[2]).view(shape)
    mesh = Mesh(*shape)
    for dim, axis in enumerate(AXES):
        # move the axis last: each row then holds the ranks that differ only along it
        rows = grid.movedim(dim, -1).reshape(-1, shape[dim]).tolist()
        assert sorted(mesh.groups(axis)) == sorted(rows)
        assert mesh.groups(axis) == sorted(mesh.groups(axis))  # ordered by lowest rank
        for row in rows:
            for rank in row:
                assert mesh.group_of(rank, axis) == row


def test_tp_is_innermost_so_tp_groups_stay_inside_a_node():
    mesh = Mesh(pp=1, dp=2, tp=8)  # 16 GPUs on 2 nodes of 8
    assert mesh.groups("tp") == [list(range(8)), list(range(8, 16))]
    assert all(len({r // 8 for r in g}) == 1 for g in mesh.groups("tp"))
    assert mesh.groups("dp") == [[t, t + 8] for t in range(8)]  # DP crosses the nodes
    assert Mesh(2, 2, 2).coords(5) == (1, 0, 1) and Mesh(2, 2, 2).coords(5).d == 0


def test_for_world_checks_the_product():
    assert Mesh.for_world(8, pp=2, dp=2, tp=2) == Mesh(2, 2, 2)
    assert Mesh.for_world(4, dp=4) == Mesh(1, 4, 1)
    with pytest.raises(ValueError, match=r"pp·dp·tp = 2·2·1 = 4, but the world size is 8: choose sizes whose product is 8"):
        Mesh.for_world(8, pp=2, dp=2)
    with pytest.raises(ValueError, match="world_size must be a positive int"):
        Mesh.for_world(0, dp=1)


@pytest.mark.parametrize("kwargs,match", [
    (dict(pp=0), "pp must be a positive int"),
    (dict(dp=-2), "dp must be a positive int"),
    (dict(tp=2.0), "tp must be a positive int"),
    (dict(tp=True), "tp must be a positive int"),
])
def test_bad_sizes(kwargs, match):
    with pytest.raises(ValueError, match=match):
        Mesh(**kwargs)


def test_bad_ranks_coordinates_and_axes():
    mesh = Mesh(2, 2, 2)
    for rank in (-1, 8, 1.0, "3", None):
        with pytest.raises(ValueError, match="rank must be an int from 0 to 7"):
            mesh.coords(rank)
    with pytest.raises(ValueError, match="p must be an int from 0 to 1"):
        mesh.rank_of(2, 0, 0)
    with pytest.raises(ValueError, match="t must be an int from 0 to 1"):
        mesh.rank_of(0, 0, -1)
    with pytest.raises(ValueError, match="axis must be one of 'pp', 'dp', 'tp'"):
        mesh.groups("cp")
    with pytest.raises(ValueError, match="axis must be one of"):
        mesh.group_of(0, "TP")


# ----------------------------------------------------------------- any number of axes

GRIDS = [dict(dp=3), dict(dp=2, ep=2), dict(pp=2, dp=3, cp=2, tp=2), dict(pp=2, dp=1, ep=4, cp=1, tp=2),
         dict(a=2, b=3, c=1, d=2, e=2)]


@pytest.mark.parametrize("axes", GRIDS, ids=lambda a: "x".join(f"{k}{v}" for k, v in a.items()))
def test_a_grid_of_any_axes_is_arange_view(axes):
    sizes = tuple(axes.values())
    world = torch.arange(torch.Size(sizes).numel()).view(sizes)
    g = Grid.of(**axes)
    assert g.world_size == world.numel() and g.names == tuple(axes)
    for index in itertools.product(*map(range, sizes)):
        rank = int(world[index])
        assert g.coords(rank) == dict(zip(axes, index)) and g.rank_of(**dict(zip(axes, index))) == rank
    for dim, axis in enumerate(axes):
        rows = world.movedim(dim, -1).reshape(-1, sizes[dim]).tolist()
        assert g.groups(axis) == sorted(rows)
        assert g.stride(axis) == world.stride(dim)


def test_the_3d_mesh_is_the_grid_pp_dp_tp():
    for shape in SHAPES:
        mesh = Mesh(*shape)
        assert mesh.grid == Grid.of(pp=shape[0], dp=shape[1], tp=shape[2])
        assert all(tuple(mesh.coords(r)) == tuple(mesh.grid.coords(r).values()) for r in range(mesh.world_size))


def test_expert_groups_of_a_dp_ep_grid_are_consecutive_ranks():
    g = Grid.of(dp=2, ep=4)
    assert g.groups("ep") == [[0, 1, 2, 3], [4, 5, 6, 7]] and g.groups("dp") == [[r, r + 4] for r in range(4)]
    assert g.placement(NodeLayout(2, 4)) == {"dp": 2, "ep": 1}


def test_bad_grids_get_clear_errors():
    with pytest.raises(ValueError, match="ep must be a positive int"):
        Grid.of(dp=2, ep=0)
    with pytest.raises(ValueError, match="axis names must differ"):
        Grid(("dp", "dp"), (2, 2))
    with pytest.raises(ValueError, match="one size per axis name"):
        Grid(("dp",), (2, 2))
    with pytest.raises(ValueError, match="give one coordinate per axis of Grid\\(dp=2, ep=2\\): dp, ep"):
        Grid.of(dp=2, ep=2).rank_of(dp=1)
    with pytest.raises(ValueError, match="ep must be an int from 0 to 1 for Grid"):
        Grid.of(dp=2, ep=2).rank_of(dp=1, ep=2)
    with pytest.raises(ValueError, match="axis must be one of 'dp', 'ep', got 'tp'"):
        Grid.of(dp=2, ep=2).groups("tp")


# ----------------------------------------------------------------- real nodes

TORCHRUN_2x2 = {"WORLD_SIZE": "4", "GROUP_WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2"}


def test_the_node_layout_comes_from_torchrun_then_slurm():
    layout = NodeLayout.from_env(TORCHRUN_2x2)
    assert (layout.nnodes, layout.per_node, layout.world_size) == (2, 2, 4)
    assert [layout.node_of(r) for r in range(4)] == [0, 0, 1, 1]
    assert "GROUP_WORLD_SIZE=2" in layout.source
    slurm = NodeLayout.from_env({"SLURM_NNODES": "2", "SLURM_GPUS_ON_NODE": "8"})
    assert (slurm.nnodes, slurm.per_node) == (2, 8) and slurm.source.startswith("Slurm")
    assert NodeLayout.from_env({**TORCHRUN_2x2, "SLURM_NNODES": "1", "SLURM_GPUS_ON_NODE": "8"}) == layout
    assert NodeLayout.from_env({"SLURM_NNODES": "2"}) is None  # no GPU count: no layout
    assert NodeLayout.from_env({}) is None


def test_a_layout_that_is_not_even_is_refused():
    with pytest.raises(ValueError, match="WORLD_SIZE=5 is not GROUP_WORLD_SIZE × LOCAL_WORLD_SIZE = 2 × 2"):
        NodeLayout.from_env({**TORCHRUN_2x2, "WORLD_SIZE": "5"})
    with pytest.raises(ValueError, match="LOCAL_WORLD_SIZE='two' is not a positive whole number"):
        NodeLayout.from_env({**TORCHRUN_2x2, "LOCAL_WORLD_SIZE": "two"})
    with pytest.raises(ValueError, match="rank must be an int from 0 to 3"):
        NodeLayout(2, 2).node_of(4)


def test_on_real_nodes_tp_stays_inside_a_node_and_the_crossing_axes_are_named():
    two_dgx = NodeLayout(2, 8)
    assert Mesh.on_nodes(two_dgx, pp=2, dp=2, tp=4).placement(two_dgx) == {"pp": 2, "dp": 1, "tp": 1}
    assert Mesh.on_nodes(two_dgx, dp=2, tp=8).placement(two_dgx) == {"pp": 1, "dp": 2, "tp": 1}
    assert Mesh(dp=16).nodes_spanned("dp", two_dgx) == 2
    with pytest.raises(ValueError, match=r"tp=4 crosses nodes on 2 node\(s\) of 2 ranks .* divides 2"):
        Mesh.on_nodes(NodeLayout(2, 2), tp=4)
    with pytest.raises(ValueError, match="tp=3 crosses nodes"):  # [3, 4, 5] straddles nodes of 4
        Mesh.on_nodes(NodeLayout(3, 4), dp=4, tp=3)
    with pytest.raises(ValueError, match="holds 16 ranks but"):
        Mesh(dp=2).placement(two_dgx)


def test_the_planners_cluster_takes_the_launchs_nodes():
    from parlab.planner import H200, Cluster

    c = Cluster.from_launch(TORCHRUN_2x2, memory=40e9)
    assert (c.gpus, c.gpus_per_node, c.memory) == (4, 2, 40e9)
    assert H200().with_nodes(NodeLayout(4, 8)).gpus == 32 and H200().with_nodes(NodeLayout(4, 8)).name == "H200"
    with pytest.raises(ValueError, match="not in a launch .* Cluster\\(gpus, gpus_per_node=...\\)"):
        Cluster.from_launch({})
    with pytest.raises(TypeError, match="gpus_per_node come"):
        Cluster.from_launch(TORCHRUN_2x2, gpus_per_node=8)


def test_a_groups_span_is_the_ranks_it_runs_over():
    # every grid of three axes of sizes 1-4 and every run of adjacent axes: last member - first + 1
    runs = [("a",), ("b",), ("c",), ("a", "b"), ("b", "c"), ("a", "b", "c")]
    for sizes in itertools.product([1, 2, 3, 4], repeat=3):
        g = Grid(("a", "b", "c"), sizes)
        for axes in runs:
            others = [x for x in g.names if x not in axes]
            groups = {}
            for r in range(g.world_size):
                groups.setdefault(tuple(g.coords(r)[o] for o in others), []).append(r)
            inner = g.stride(axes[-1])
            assert {max(grp) - min(grp) + inner for grp in groups.values()} == {g.span(axes)}, (sizes, axes)
            # a span that fits a node it divides never leaves it; one larger than a node always does
            for per_node in (1, 2, 4, 8, 12, 16):
                listed = any(len({r // per_node for r in grp}) > 1 for grp in groups.values())
                if per_node % g.span(axes) == 0 or g.span(axes) > per_node:
                    assert listed == (g.span(axes) > per_node) or len(groups[next(iter(groups))]) == 1
    with pytest.raises(ValueError, match="adjacent"):
        Grid.of(pp=2, dp=2, tp=2).span(("pp", "tp"))


def test_the_planner_places_its_axes_on_the_grid():
    from parlab import planner
    plan = planner.Plan(dp=4, tp=4, pp=4, cp=1, zero=1, micro_batch=1, accum=8)
    c = planner.Cluster(64)
    g = planner.grid(plan)
    assert (g.names, g.sizes) == (("pp", "dp", "cp", "tp"), (4, 4, 1, 4))
    layout = NodeLayout(8, 8)
    for axis, crosses in (("tp", False), ("dp", True)):
        assert planner.axis_crosses(plan, c, axis) == crosses == (g.nodes_spanned(axis, layout) > 1)
    assert planner.boundary_crosses(plan, c) == [True, True, True]
    # Megatron-Core's expert grid: EP ranks tp apart, without CP
    moe = planner.Plan(dp=8, tp=2, pp=1, cp=2, zero=1, micro_batch=1, accum=1, ep=4)
    assert planner.expert_grid(moe).stride("ep") == 2 and not planner.axis_crosses(moe, planner.Cluster(32), "ep")
