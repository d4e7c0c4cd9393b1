"""Lab 06's checks (sections 1-3): they pass correct answers written differently from the
notebook's solution and reject every wrong answer in tests/wrong_answers/lab06.py with
a message that names its mistake.

The coordinate exercises are graded in this process.  The all-reduces and the DP sync go
through ``harness.grade_batch``: one launch per world size for all answers at once
(visible: 4 ranks; hidden: 2).  The answer that creates only its own group crashes or
waits on some ranks, so it runs alone, through the public check, with a short timeout.
"""
import pytest
import torch
import torch.distributed as dist

from parlab.grading import harness, lab06
from grading_reports import short_keys as _short
from wrong_answers import lab06 as wrong

pytestmark = [pytest.mark.ranks, pytest.mark.timeout(300)]


# ---------------------------------------------------------------- correct answers, written differently
def coords_divmod(rank, pp, dp, tp):
    rest, t = divmod(rank, tp)
    p, d = divmod(rest, dp)
    return p, d, t


def coords_arange(rank, pp, dp, tp):
    """Looks the rank up in torch.arange(world).view(pp, dp, tp); returns a list of ints."""
    where = (torch.arange(pp * dp * tp).view(pp, dp, tp) == rank).nonzero()[0]
    return [int(x) for x in where]


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
    "coords": {"coords_divmod": coords_divmod, "coords_arange": coords_arange},
    "rank_of": {"rank_of_horner": rank_of_horner, "rank_of_arange": rank_of_arange},
    "groups": {"groups_loops": groups_loops, "groups_arange": groups_arange},
    "axis": {"axis_async_cached": axis_async_cached, "axis_reverse_order": axis_reverse_order},
    "mesh": {"mesh_flattened_names": mesh_flattened_names, "mesh_sub_mesh": mesh_sub_mesh},
    "sync": {"sync_flat": sync_flat, "sync_async": sync_async, "sync_avg": sync_avg},
}


def _batch(with_wrong: bool) -> dict:
    batch = {lab06.EXERCISES[ex]: dict(answers) for ex, answers in CORRECT.items()}
    if with_wrong:
        for ex, fixtures in wrong.WRONG.items():
            batch[lab06.EXERCISES[ex]].update({f.__name__: f for f, _ in fixtures})
    return batch


@pytest.fixture(scope="module")
def visible():
    return _short(harness.grade_batch(_batch(True)))


@pytest.fixture(scope="module")
def hidden():
    return _short(harness.grade_batch(_batch(False), hidden=True))


@pytest.mark.parametrize("ex,name", [(ex, n) for ex in CORRECT for n in CORRECT[ex]])
def test_correct_answers_pass_visible_and_hidden(visible, hidden, ex, name):
    assert visible[(ex, name)] is None, visible[(ex, name)]
    assert hidden.get((ex, name)) is None, hidden[(ex, name)]


@pytest.mark.parametrize("ex,fixture,words", [(ex, f, w) for ex, fs in wrong.WRONG.items() for f, w in fs])
def test_wrong_answers_fail_visible(visible, ex, fixture, words):
    msg = visible[(ex, fixture.__name__)]
    assert msg is not None, f"{fixture.__name__} passed the visible {ex} check"
    assert words in msg, msg


@pytest.mark.parametrize("ex,fixture,words", [(ex, f, w) for ex, fs in wrong.ALONE.items() for f, w in fs])
def test_answers_that_crash_some_ranks_are_named(ex, fixture, words):
    check = {"axis": lab06.check_axis_all_reduce}[ex]
    with pytest.raises(AssertionError) as err:
        check(fixture, timeout=30)
    assert words in str(err.value), str(err.value)


def test_not_a_function():
    with pytest.raises(AssertionError, match="expected your coords"):
        lab06.check_coords(None)
