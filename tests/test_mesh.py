"""parlab.parallel.mesh: the pure rank <-> (p, d, t) mapping, checked against
``torch.arange(world).view(pp, dp, tp)`` (the same layout ``init_device_mesh``
builds; tests/test_mesh_device.py compares with its process groups)."""
import itertools

import pytest
import torch

from parlab.parallel.mesh import AXES, Coords, Mesh

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
