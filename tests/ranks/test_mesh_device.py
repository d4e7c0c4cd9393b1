"""parlab.parallel.mesh agrees with torch's own device mesh: 8 gloo ranks build
``init_device_mesh("cpu", (pp, dp, tp), mesh_dim_names=("pp", "dp", "tp"))``
for several shapes and report each axis's process-group ranks and their own
coordinate, which must equal ``Mesh.group_of`` and ``Mesh.coords``.

One 8-rank launch covers every shape (a cold 8-rank start is the cost here)."""
import pytest

import parlab
from parlab.parallel.mesh import AXES, Mesh

pytestmark = [pytest.mark.ranks, pytest.mark.timeout(300)]

SHAPES = [(2, 2, 2), (1, 2, 4), (2, 1, 4), (4, 2, 1)]


def torch_mesh_groups(shapes):
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    out = {}
    for shape in shapes:
        mesh = init_device_mesh("cpu", shape, mesh_dim_names=("pp", "dp", "tp"))
        out[shape] = {"coordinate": tuple(mesh.get_coordinate())}
        for axis in ("pp", "dp", "tp"):
            out[shape][axis] = dist.get_process_group_ranks(mesh.get_group(axis))
    return out


def test_groups_and_coordinates_match_init_device_mesh():
    per_rank = parlab.launch(torch_mesh_groups, args=(SHAPES,), nproc=8, backend="gloo", timeout=240)
    for shape in SHAPES:
        mesh = Mesh(*shape)
        for rank, got in enumerate(per_rank):
            assert got[shape]["coordinate"] == tuple(mesh.coords(rank)), (shape, rank)
            for axis in AXES:
                assert got[shape][axis] == mesh.group_of(rank, axis), (shape, rank, axis)
