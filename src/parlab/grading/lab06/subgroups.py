"""Lab 06, section 2: an all-reduce along one axis of a dp × tp mesh, with ``new_group`` and a DeviceMesh.

Rank r's input holds ``(1, 2, 3, ...) · 2**r``, so a sum tells exactly which
ranks it added: element 0 of the result is the bit mask of the ranks
summed.  A wrong answer is named from that mask (the whole world, the other
axis, no sum at all).

While the answer runs, ``watching(spy)`` notes, besides the spy's own record,
the ranks of every ``dist.new_group`` it creates, the group of every
collective it makes, and every ``DeviceMesh.get_group`` it calls (mesh shape,
dimension names, the group's ranks).  The rules are judged on those notes:
every rank must create the same groups in the same order (a rank that
creates only its own group leaves the others waiting, or pairs the wrong
ranks), and the one all-reduce must be on this rank's group along the axis.
"""
from __future__ import annotations

import contextlib
import inspect
from dataclasses import dataclass

import torch

from ...parallel.mesh import Mesh
from ..harness import Exercise, Graded, Rule
from ..plain import plain
from ..records import events

#: Collectives whose group the notes record.
NOTED = ("all_reduce", "broadcast", "reduce", "all_gather", "all_gather_into_tensor", "reduce_scatter",
         "reduce_scatter_tensor", "all_gather_single", "reduce_scatter_single", "all_to_all_single",
         "barrier")


# ---------------------------------------------------------------- notes on the ranks
def _ranks_of(group) -> list[int]:
    import torch.distributed as dist

    if group is None:
        return list(range(dist.get_world_size()))
    return [int(r) for r in dist.get_process_group_ranks(group)]


@contextlib.contextmanager
def watching(spy):
    """``spy.watch()``, also noting groups created, collectives' groups and DeviceMesh groups."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import DeviceMesh

    # signatures of torch's own functions, read before the spy puts its wrappers in their place
    sigs = {op: inspect.signature(getattr(dist, op)) for op in NOTED if hasattr(dist, op)}
    with spy.watch():
        saved = [(dist, op, getattr(dist, op)) for op in NOTED + ("new_group",) if hasattr(dist, op)]
        saved.append((DeviceMesh, "get_group", DeviceMesh.get_group))

        def noted(op, fn):
            sig = sigs[op]

            def wrapper(*args, **kwargs):
                try:
                    group = sig.bind(*args, **kwargs).arguments.get("group")
                    spy.note("collective", op=op, ranks=_ranks_of(group))
                except (TypeError, ValueError, RuntimeError):
                    spy.note("collective", op=op, ranks=None)
                return fn(*args, **kwargs)
            return wrapper

        def created(fn):
            def wrapper(ranks=None, *args, **kwargs):
                group = fn(ranks, *args, **kwargs)
                spy.note("new_group", ranks=sorted(int(r) for r in ranks) if ranks is not None else None)
                return group
            return wrapper

        def get_group(mesh, *args, **kwargs):
            group = saved[-1][2](mesh, *args, **kwargs)
            spy.note("get_group", shape=list(mesh.mesh.shape), names=list(mesh.mesh_dim_names or ()),
                     ranks=_ranks_of(group))
            return group

        try:
            for obj, name, fn in saved[:-1]:
                setattr(obj, name, created(fn) if name == "new_group" else noted(name, fn))
            DeviceMesh.get_group = get_group
            yield spy
        finally:
            for obj, name, fn in saved:
                setattr(obj, name, fn)


# ---------------------------------------------------------------- cases
@dataclass(frozen=True)
class AxisCase:
    """All-reduce a tensor of ``shape`` along ``axis`` of a dp × tp mesh (TP innermost)."""

    dp: int
    tp: int
    axis: str
    shape: tuple = (3,)

    def describe(self, n: int) -> str:
        return f"axis {self.axis!r} of a dp={self.dp} × tp={self.tp} mesh, a tensor of shape {self.shape}, world_size {n}"

    def group(self, rank: int) -> list[int]:
        return Mesh(pp=1, dp=self.dp, tp=self.tp).group_of(rank, self.axis)


def _input(case: AxisCase, rank: int) -> torch.Tensor:
    n = 1
    for s in case.shape:
        n *= s
    return (torch.arange(1, n + 1, dtype=torch.float32) * 2.0 ** rank).reshape(case.shape)


def _run_axis(fn, case: AxisCase, i, spy):
    import torch.distributed as dist

    from ...launch.runtime import device

    t = _input(case, dist.get_rank()).to(device())  # case.shape: every rank's whole tensor, no shard
    with watching(spy):
        out = fn(t, case.axis, case.dp, case.tp)
    return {"t": plain(t), "returned": plain(out, keep=(), containers=(), other="none")}


def _ranks_in(value: torch.Tensor) -> list[int] | None:
    """The ranks whose inputs ``value`` is the sum of (from element 0, a bit mask), or None."""
    v = float(value.reshape(-1)[0])
    if v != int(v) or v < 0:
        return None
    return [r for r in range(64) if int(v) >> r & 1]


def _grade_axis(g: Graded) -> str | None:
    for i, case in enumerate(g.cases[:min(len(r) for r in g.results)]):
        created = [[tuple(e["ranks"] or ()) for e in events(rec[i], "new_group")] for rec in g.records]
        for r, res in enumerate(g.at(i)):
            mine = case.group(r)
            want = sum(_input(case, k) for k in mine)
            if torch.equal(res["t"], want):
                continue
            where = f"{g.name} is wrong for {case.describe(g.n)}: on rank {r}"
            if res["returned"] is not None and torch.equal(res["returned"], want):
                return (f"{where}, t holds {res['t'].tolist()}, but the sum was returned in a new "
                        "tensor. All-reduce t in place (as dist.all_reduce does) and return it.")
            if len(set(map(tuple, created))) > 1:
                return (f"{where}, the ranks created different groups: rank 0 called new_group for "
                        f"{[list(c) for c in created[0]]}, rank {r} for {[list(c) for c in created[r]]}. "
                        + CREATE_ALL)
            meshes = [e for e in events(g.records[r][i], "get_group")]
            if meshes and not _mesh_of(meshes[-1], case):
                return (f"{where}, the DeviceMesh has shape {meshes[-1]['shape']} with names "
                        f"{meshes[-1]['names']}; " + MESH_SHAPE)
            got = _ranks_in(res["t"]) if res["t"].shape == want.shape else None
            msg = f"{where}, t is {res['t'].reshape(-1)[:4].tolist()}..., expected {want.reshape(-1)[:4].tolist()}..."
            if got is None:
                return msg
            other = "tp" if case.axis == "dp" else "dp"
            if got == list(range(g.n)) and len(mine) < g.n:
                return msg + " That is the sum over the whole world, not over this rank's group along the axis."
            if got == case.group(r) or got == [r]:
                return msg + (" t was not summed with any other rank." if got == [r] else "")
            if got == Mesh(pp=1, dp=case.dp, tp=case.tp).group_of(r, other):
                return msg + (f" That is the sum along {other!r}, over ranks {got}. " + LAYOUT)
            return msg + f" That is the sum over ranks {got}; rank {r}'s {case.axis} group is {mine}. " + LAYOUT
    return None


LAYOUT = ("TP is innermost: the TP group of rank r is the tp consecutive ranks around it, its DP group "
          "the ranks r mod tp, r mod tp + tp, ...")
MESH_SHAPE = ("build it as init_device_mesh(device_type, (dp, tp), mesh_dim_names=(\"dp\", \"tp\")), "
              "the outer dimension first, TP innermost, and take the group with mesh.get_group(axis) "
              "or mesh[axis].get_group().")
CREATE_ALL = ("dist.new_group is collective over the whole world: every rank must call it for every "
              "group, in the same order, even for the groups it is not in, and keep the one it is in.")


# ---------------------------------------------------------------- rules
def same_groups_created(records, case, n):
    created = [[tuple(e["ranks"] or ()) for e in events(rec, "new_group")] for rec in records]
    for r, c in enumerate(created):
        if c != created[0]:
            return (f"rank 0 created the groups {[list(x) for x in created[0]]} and rank {r} "
                    f"{[list(x) for x in c]}: " + CREATE_ALL)
    want = sorted(tuple(x) for x in Mesh(pp=1, dp=case.dp, tp=case.tp).groups(case.axis))
    made = sorted(set(created[0]))
    if created[0] and not all(w in made for w in want):
        missing = [list(w) for w in want if w not in made]
        return f"no rank created the group(s) {missing}, which the ranks in them need. " + CREATE_ALL
    return None


def one_all_reduce_on_the_axis(records, case, n):
    for r, rec in enumerate(records):
        calls = events(rec, "collective")
        reduces = [c for c in calls if c["op"] == "all_reduce"]
        others = sorted({c["op"] for c in calls if c["op"] != "all_reduce"})
        if others:
            return f"rank {r} called {', '.join(others)}; one all-reduce on the axis group is all it takes."
        if len(reduces) != 1:
            return f"rank {r} made {len(reduces)} all-reduces; make exactly one, on its group along the axis."
        if reduces[0]["ranks"] != case.group(r):
            world = " (the whole world)" if reduces[0]["ranks"] == list(range(n)) else ""
            return (f"rank {r} all-reduced over ranks {reduces[0]['ranks']}{world}; its {case.axis} group "
                    f"is {case.group(r)}.")
    return None


def used_device_mesh(records, case, n):
    for r, rec in enumerate(records):
        if events(rec, "new_group"):
            return f"rank {r} called dist.new_group: here the DeviceMesh creates every group."
        got = events(rec, "get_group")
        if not got:
            return f"rank {r} never called mesh.get_group(axis): take the axis's group from the DeviceMesh."
        if not _mesh_of(got[-1], case):
            return f"rank {r}'s DeviceMesh has shape {got[-1]['shape']} and names {got[-1]['names']}; " + MESH_SHAPE
    return None


def _mesh_of(call: dict, case) -> bool:
    """Was the group taken from the (dp, tp) mesh: ``mesh.get_group(axis)`` on the 2-D mesh, or
    ``mesh[axis].get_group()`` on its 1-D slice along the axis?"""
    if call["shape"] == [case.dp, case.tp] and call["names"] == ["dp", "tp"]:
        return True
    return call["names"] == [case.axis] and call["shape"] == [case.dp if case.axis == "dp" else case.tp]


# ---------------------------------------------------------------- the exercises
def _cases(dp: int, tp: int, shapes=((3,), (2, 2))) -> tuple:
    return tuple(AxisCase(dp, tp, axis, shape) for axis, shape in zip(("dp", "tp"), shapes))


_VISIBLE = ((4, _cases(2, 2) + _cases(4, 1, ((2,), (1,))) + _cases(1, 4, ((1, 3), (5,)))),)
_HIDDEN = ((2, _cases(2, 1, ((4,), (2, 3))) + _cases(1, 2, ((3, 1), (2,)))),)
_HANG = ("the ranks waited for each other. " + CREATE_ALL
         + " (Creating only your own group is the classic mistake.)")
_SAYS_CREATE = ("Every rank calls `dist.new_group` for every group along the axis, in the same order, "
                "even for the groups it is not in.")
_SAYS_ONE = "Make exactly one `dist.all_reduce`, on this rank's group along `axis`: not on the whole world."
_SAYS_MESH = ("Take the group from a DeviceMesh of shape (dp, tp) named (\"dp\", \"tp\"), with "
              "`mesh.get_group(axis)` or `mesh[axis].get_group()`: no `dist.new_group`.")


def _group_error(text: str) -> str:
    if "new_group" in text or "Connection" in text or "pair.cc" in text or "rendezvous" in text.lower():
        return CREATE_ALL + " (Creating only your own group is the classic mistake.)"
    return ""


AXIS = Exercise(key="lab06.axis", answer="axis_all_reduce", run=_run_axis, grade=_grade_axis,
                visible=_VISIBLE, hidden=_HIDDEN, timeout=60,
                rules=(Rule(_SAYS_CREATE, same_groups_created), Rule(_SAYS_ONE, one_all_reduce_on_the_axis)),
                on_hang=_HANG, on_error=_group_error)
MESH = Exercise(key="lab06.mesh", answer="mesh_all_reduce", run=_run_axis, grade=_grade_axis,
                visible=_VISIBLE, hidden=(), timeout=60,
                rules=(Rule(_SAYS_MESH, used_device_mesh), Rule(_SAYS_ONE, one_all_reduce_on_the_axis)),
                on_hang=_HANG, on_error=_group_error)
