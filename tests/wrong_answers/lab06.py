"""Typical wrong answers to Lab 06's exercises (mesh coordinates, sub-group all-reduces, DP sync).

The four tables of tests/answer_suite.py: ``CORRECT`` (right answers written
differently from the notebook's), ``WRONG``, ``ALONE`` (graded one at a time),
each keyed by the exercises of ``parlab.grading.lab06.EXERCISES``; a wrong
answer comes with the words the check's message must contain.
tests/ranks/test_lab06.py runs every fixture, batched into one launch per world size.
"""
import torch
import torch.distributed as dist

from wrong_answers import says


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


def mesh_all_reduce_twice(t, axis, dp, tp):
    """Right numbers the wrong way: the group from the DeviceMesh, the sum made by two
    all-reduces of half the tensor's value each."""
    from torch.distributed.device_mesh import init_device_mesh

    group = init_device_mesh("cpu", (dp, tp), mesh_dim_names=("dp", "tp")).get_group(axis)
    half = t / 2
    dist.all_reduce(half, group=group)
    t.sub_(t / 2)                      # the other half, in place
    dist.all_reduce(t, group=group)
    return t.add_(half)


# ------------------------------------------------------------ exercise 3: DP sync in 2-D training
def sync_over_world(model, dp_group):
    n = dist.get_world_size()
    for p in model.parameters():
        dist.all_reduce(p.grad)
        p.grad /= n


def sync_no_divide(model, dp_group):
    for p in model.parameters():
        dist.all_reduce(p.grad, group=dp_group)


def sync_then_world_barrier(model, dp_group):
    """Right gradients, then a barrier over the whole world "to be safe": a collective off dp_group."""
    n = dist.get_world_size(dp_group)
    for p in model.parameters():
        dist.all_reduce(p.grad, group=dp_group)
        p.grad /= n
    dist.barrier()


def sync_divide_by_world(model, dp_group):
    for p in model.parameters():
        dist.all_reduce(p.grad, group=dp_group)
        p.grad /= dist.get_world_size()


def sync_nothing(model, dp_group):
    pass


# ------------------------------------------------------------ correct answers, written differently
def coords_divmod(rank, pp, dp, tp):
    rest, t = divmod(rank, tp)
    p, d = divmod(rest, dp)
    return p, d, t


def coords_arange(rank, pp, dp, tp):
    """Looks the rank up in torch.arange(world).view(pp, dp, tp)."""
    where = (torch.arange(pp * dp * tp).view(pp, dp, tp) == rank).nonzero()[0]
    return tuple(int(x) for x in where)


def coords_as_list(rank, pp, dp, tp):
    """The right numbers as a list: the notebook asks for the tuple (p, d, t)."""
    return list(coords_arange(rank, pp, dp, tp))


def rank_of_horner(p, d, t, pp, dp, tp):
    return (p * dp + d) * tp + t


def rank_of_arange(p, d, t, pp, dp, tp):
    return torch.arange(pp * dp * tp).view(pp, dp, tp)[p, d, t]  # a 0-d tensor


def groups_loops(axis, pp, dp, tp):
    """Groups in an unusual order (largest first), each group in rank order."""
    out = {}
    for r in range(pp * dp * tp):
        p, d, t = coords_divmod(r, pp, dp, tp)
        key = {"pp": (d, t), "dp": (p, t), "tp": (p, d)}[axis]
        out.setdefault(key, []).append(r)
    return sorted(out.values(), reverse=True)


def groups_arange(axis, pp, dp, tp):
    grid = torch.arange(pp * dp * tp).view(pp, dp, tp)
    dim = {"pp": 0, "dp": 1, "tp": 2}[axis]
    return [tuple(g) for g in grid.movedim(dim, -1).reshape(-1, grid.shape[dim]).tolist()]


def axis_async_cached(t, axis, dp, tp):
    """Creates every group once per (axis, dp, tp), keeps them, waits on an async all-reduce."""
    key = (axis, dp, tp)
    cache = axis_async_cached.__dict__.setdefault("groups", {})
    if key not in cache:
        lists = ([[d * tp + j for j in range(tp)] for d in range(dp)] if axis == "tp"
                 else [[d * tp + j for d in range(dp)] for j in range(tp)])
        cache[key] = {tuple(g): dist.new_group(g) for g in lists}
    rank = dist.get_rank()
    group = next(g for ranks, g in cache[key].items() if rank in ranks)
    dist.all_reduce(t, op=dist.ReduceOp.SUM, group=group, async_op=True).wait()
    return t


def axis_reverse_order(t, axis, dp, tp):
    """Creates the groups last to first (the same order on every rank) and returns nothing."""
    lists = ([[d * tp + j for j in range(tp)] for d in range(dp)] if axis == "tp"
             else [[d * tp + j for d in range(dp)] for j in range(tp)])
    made = {tuple(g): dist.new_group(g) for g in reversed(lists)}
    dist.all_reduce(t, group=next(g for ranks, g in made.items() if dist.get_rank() in ranks))


def mesh_flattened_names(t, axis, dp, tp):
    """Builds the mesh from the device type of t and reads the group by dimension index."""
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh(t.device.type, (dp, tp), mesh_dim_names=("dp", "tp"))
    dist.all_reduce(t, group=mesh.get_group(mesh_dim=("dp", "tp").index(axis)))
    return t


def mesh_sub_mesh(t, axis, dp, tp):
    """Takes the group from the 1-D slice of the mesh along the axis: mesh[axis].get_group()."""
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (dp, tp), mesh_dim_names=("dp", "tp"))
    dist.all_reduce(t, group=mesh[axis].get_group())
    return t


def sync_avg(model, dp_group):
    """ReduceOp.AVG: sum and divide in one call (gloo accepts it in torch 2.13)."""
    for p in model.parameters():
        dist.all_reduce(p.grad, op=dist.ReduceOp.AVG, group=dp_group)


def sync_flat(model, dp_group):
    """One flat all-reduce of every gradient, then copied back."""
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat, group=dp_group)
    flat /= dist.get_world_size(group=dp_group)
    off = 0
    for g in grads:
        g.copy_(flat[off:off + g.numel()].view_as(g))
        off += g.numel()


def sync_async(model, dp_group):
    """Launches every all-reduce, then waits and divides."""
    n = dist.get_world_size(dp_group)
    works = [(p, dist.all_reduce(p.grad, group=dp_group, async_op=True)) for p in model.parameters()]
    for p, work in works:
        work.wait()
        p.grad.div_(n)


CORRECT = {
    "coords": [coords_divmod, coords_arange],
    "rank_of": [rank_of_horner, rank_of_arange],
    "groups": [groups_loops, groups_arange],
    "axis": [axis_async_cached, axis_reverse_order],
    "mesh": [mesh_flattened_names, mesh_sub_mesh],
    "sync": [sync_flat, sync_async, sync_avg],
}

#: Run alone, through the public check: the ranks that created different groups crash or wait.
ALONE = {"axis": [(axis_own_group_only, "even for the groups it is not in")]}

WRONG = {
    "coords": [(coords_tp_outermost, "TP outermost"), (coords_dp_innermost, "d fastest"),
               (coords_off_by_one, "returned (0, 0, 0), expected (1, 0, 0)"), (coords_list_of_floats, "tuple of three ints"),
               (coords_as_list, ("returned the list [0, 0, 0]", "the tuple (0, 0, 0)"))],
    "rank_of": [(rank_of_not_inverse, "must undo coords"), (rank_of_off_by_one, "expected 2"),
                (rank_of_returns_tuple, "one int")],
    "groups": [(groups_tp_outermost, "would cross"), (groups_axes_swapped, "groups along 'dp'"),
               (groups_own_only, "exactly one group")],
    "axis": [(axis_world_sum, "whole world"),
             (axis_swapped, "sum along 'tp'"), (axis_returns_new, "in place"),
             (axis_world_then_subtract, "Make exactly one `dist.all_reduce`")],
    "mesh": [(mesh_dims_swapped, "init_device_mesh(device_type, (dp, tp)"), (mesh_by_new_group, "no `dist.new_group`"),
             (mesh_all_reduce_twice, "Make exactly one `dist.all_reduce`"),
             (mesh_world_sum, "whole world")],
    "sync": [(sync_over_world, says("averaged over the whole world", never=("too large", "1/tp", "own gradient"))),
             (sync_no_divide, says("dp times too large", never=("whole world", "1/tp", "own gradient"))),
             (sync_divide_by_world, says("divided by the world size", never=("too large", "own gradient"))),
             (sync_nothing, says("not averaged", never=("too large", "1/tp", "whole world"))),
             (sync_then_world_barrier, "Communicate only over `dp_group`")],
}
