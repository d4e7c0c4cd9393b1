"""Typical wrong answers to Lab 06's exercises (mesh coordinates, sub-group all-reduces, DP sync).

``WRONG`` maps each exercise of ``parlab.grading.lab06.EXERCISES`` to a list
of (fixture, words the check's message must contain).  tests/ranks/test_lab06.py
runs every fixture, batched into one launch per world size.
"""
import torch
import torch.distributed as dist


# ------------------------------------------------------------ exercise 1: coordinates
def coords_tp_outermost(rank, pp, dp, tp):
    """p varies fastest and t slowest: the layout torch.arange(world).view(tp, dp, pp)."""
    return rank % pp, rank // pp % dp, rank // (pp * dp)


def coords_dp_innermost(rank, pp, dp, tp):
    return rank // (dp * tp), rank % dp, rank // dp % tp


def coords_off_by_one(rank, pp, dp, tp):
    """The stride of p is dp·tp + 1."""
    return rank // (dp * tp + 1), rank // tp % dp, rank % tp


def coords_list_of_floats(rank, pp, dp, tp):
    return [rank / (dp * tp), rank / tp % dp, rank % tp]


def rank_of_not_inverse(p, d, t, pp, dp, tp):
    """Strides of a (pp, tp, dp) layout: not the inverse of TP-innermost coords."""
    return p * dp * tp + t * dp + d


def rank_of_off_by_one(p, d, t, pp, dp, tp):
    return p * dp * tp + d * (tp + 1) + t


def rank_of_returns_tuple(p, d, t, pp, dp, tp):
    return (p * dp + d) * tp + t,


def groups_tp_outermost(axis, pp, dp, tp):
    """Groups of the layout view(tp, dp, pp): a TP group is strided ranks, which cross nodes."""
    grid = torch.arange(pp * dp * tp).view(tp, dp, pp)
    dim = {"tp": 0, "dp": 1, "pp": 2}[axis]
    return grid.movedim(dim, -1).reshape(-1, grid.shape[dim]).tolist()


def groups_axes_swapped(axis, pp, dp, tp):
    """Gives the DP groups for "tp" and the TP groups for "dp"."""
    grid = torch.arange(pp * dp * tp).view(pp, dp, tp)
    dim = {"pp": 0, "dp": 2, "tp": 1}[axis]
    return grid.movedim(dim, -1).reshape(-1, grid.shape[dim]).tolist()


def groups_own_only(axis, pp, dp, tp):
    """Only the group of rank 0."""
    grid = torch.arange(pp * dp * tp).view(pp, dp, tp)
    dim = {"pp": 0, "dp": 1, "tp": 2}[axis]
    return [grid.movedim(dim, -1).reshape(-1, grid.shape[dim])[0].tolist()]


# ------------------------------------------------------------ exercise 2: sub-group all-reduces
def _group_lists(axis, dp, tp):
    if axis == "tp":
        return [[d * tp + t for t in range(tp)] for d in range(dp)]
    return [[d * tp + t for d in range(dp)] for t in range(tp)]


def axis_own_group_only(t, axis, dp, tp):
    """Creates only the group this rank is in: the others never call new_group for it."""
    rank = dist.get_rank()
    mine = next(g for g in _group_lists(axis, dp, tp) if rank in g)
    dist.all_reduce(t, group=dist.new_group(mine))
    return t


def axis_world_sum(t, axis, dp, tp):
    """Creates every group, then all-reduces over the whole world."""
    for g in _group_lists(axis, dp, tp):
        dist.new_group(g)
    dist.all_reduce(t)
    return t


def axis_swapped(t, axis, dp, tp):
    """TP groups strided and DP groups consecutive: the layout with DP innermost."""
    other = "dp" if axis == "tp" else "tp"
    rank, mine = dist.get_rank(), None
    for g in _group_lists(other, dp, tp):
        made = dist.new_group(g)
        if rank in g:
            mine = made
    dist.all_reduce(t, group=mine)
    return t


def axis_returns_new(t, axis, dp, tp):
    """Sums a copy and returns it: t itself is left as it was."""
    rank, mine = dist.get_rank(), None
    for g in _group_lists(axis, dp, tp):
        made = dist.new_group(g)
        if rank in g:
            mine = made
    out = t.clone()
    dist.all_reduce(out, group=mine)
    return out


def axis_world_then_subtract(t, axis, dp, tp):
    """Right numbers the wrong way: a world all-reduce of t masked to this rank's group."""
    rank = dist.get_rank()
    mine = next(g for g in _group_lists(axis, dp, tp) if rank in g)
    for g in _group_lists(axis, dp, tp):
        dist.new_group(g)
    parts = torch.zeros((dist.get_world_size(),) + tuple(t.shape))
    parts[rank] = t
    dist.all_reduce(parts)
    t.copy_(parts[mine].sum(0))
    return t


def mesh_dims_swapped(t, axis, dp, tp):
    """The mesh built as (tp, dp): its "tp" dimension is then the strided one."""
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (tp, dp), mesh_dim_names=("dp", "tp"))
    dist.all_reduce(t, group=mesh.get_group(axis))
    return t


def mesh_by_new_group(t, axis, dp, tp):
    """Right values, but with new_group instead of the DeviceMesh."""
    rank, mine = dist.get_rank(), None
    for g in _group_lists(axis, dp, tp):
        made = dist.new_group(g)
        if rank in g:
            mine = made
    dist.all_reduce(t, group=mine)
    return t


def mesh_world_sum(t, axis, dp, tp):
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (dp, tp), mesh_dim_names=("dp", "tp"))
    mesh.get_group(axis)
    dist.all_reduce(t)
    return t


# ------------------------------------------------------------ exercise 3: DP sync in 2-D training
def sync_over_world(model, dp_group):
    n = dist.get_world_size()
    for p in model.parameters():
        dist.all_reduce(p.grad)
        p.grad /= n


def sync_no_divide(model, dp_group):
    for p in model.parameters():
        dist.all_reduce(p.grad, group=dp_group)


def sync_divide_by_world(model, dp_group):
    for p in model.parameters():
        dist.all_reduce(p.grad, group=dp_group)
        p.grad /= dist.get_world_size()


def sync_nothing(model, dp_group):
    pass


#: Run alone, through the public check: the ranks that created different groups crash or wait.
ALONE = {"axis": [(axis_own_group_only, "even for the groups it is not in")]}

WRONG = {
    "coords": [(coords_tp_outermost, "TP outermost"), (coords_dp_innermost, "d fastest"),
               (coords_off_by_one, "expected"), (coords_list_of_floats, "tuple of three ints")],
    "rank_of": [(rank_of_not_inverse, "must undo coords"), (rank_of_off_by_one, "expected 2"),
                (rank_of_returns_tuple, "one int")],
    "groups": [(groups_tp_outermost, "would cross"), (groups_axes_swapped, "groups along 'dp'"),
               (groups_own_only, "exactly one group")],
    "axis": [(axis_world_sum, "whole world"),
             (axis_swapped, "sum along 'tp'"), (axis_returns_new, "in place"),
             (axis_world_then_subtract, "Make exactly one `dist.all_reduce`")],
    "mesh": [(mesh_dims_swapped, "init_device_mesh(device_type, (dp, tp)"), (mesh_by_new_group, "no `dist.new_group`"),
             (mesh_world_sum, "whole world")],
    "sync": [(sync_over_world, "averaged over the whole world"), (sync_no_divide, "dp times too large"),
             (sync_divide_by_world, "divided by the world size"), (sync_nothing, "not averaged")],
}
