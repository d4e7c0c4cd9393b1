"""Lab 03, exercises 1a and 1b: f and g, Megatron's two conjugate autograd Functions.

``f`` (``CopyToParallel``) is the identity in forward and all-reduces the
gradient over ``group`` in backward; ``g`` (``ReduceFromParallel``) is the
other way round.  Each rank calls ``cls.apply(x, group)`` on its own x with
its own upstream gradient (f's differ per rank; g's are the same on every
rank, as after g in a model), with the world or pairs of ranks as the group.
The grader sums the group's tensors itself and names the likely mistake
(f and g swapped, the all-reduce missing, the group ignored); the rules read
the collectives made in forward and in backward, and whether x or the
gradient was changed in place.
"""
from __future__ import annotations

import torch

from ... import check
from ..harness import Exercise, Graded, Rule
from ..plain import plain
from ..records import calls, ops
from .cases import HANG, TIMEOUT, Case, process_group, seeded_tensor, team

VISIBLE_F = ((4, (Case("f", (3, 5)), Case("f", (2, 3, 4), groups="pairs"), Case("f", (7,), seed=1))),)
VISIBLE_G = ((4, (Case("g", (3, 5)), Case("g", (2, 3, 4), groups="pairs"), Case("g", (7,), seed=1))),)

def _dy_seed(case: Case, rank: int) -> int:
    """f's upstream gradients differ per rank; g's are the same on every rank, as after g in a model."""
    return 100 + 10 * case.seed + (rank if case.kind == "f" else 0)


# ---------------------------------------------------------------- on the ranks
def run(cls, case: Case, i: int, spy) -> dict:
    """f or g on this rank's x with an upstream gradient per rank; the grader sums the group."""
    import torch.distributed as dist

    from ...launch.runtime import device

    rank = dist.get_rank()
    group = process_group(case)
    # x and dy: (*case.shape), whole on every rank (f and g split nothing), each rank's own values
    x = seeded_tensor(case.shape, 10 * case.seed + rank).to(device()).requires_grad_()
    dy = seeded_tensor(case.shape, _dy_seed(case, rank)).to(device())
    inp = x * 1  # a non-leaf input, as inside a model
    spy.guard(x=inp, dy=dy)
    with spy.watch():
        y = cls.apply(inp, group)
        spy.note("backward")
        if isinstance(y, torch.Tensor) and y.requires_grad:
            y.backward(dy)
    return {"y": plain(y) if isinstance(y, torch.Tensor) else repr(y)[:100], "dx": plain(x.grad)}


# ---------------------------------------------------------------- grader
def _group_sum(tensors: list, case: Case, r: int) -> torch.Tensor:
    return torch.stack([tensors[m] for m in team(case, len(tensors), r)]).sum(0)


def grader(which: str):
    """The grader of f (``which`` "f") or of g."""
    def grade(g: Graded) -> str | None:
        for i, case in enumerate(g.cases):
            res = g.at(i)
            xs = [seeded_tensor(case.shape, 10 * case.seed + r) for r in range(g.n)]
            dys = [seeded_tensor(case.shape, _dy_seed(case, r)) for r in range(g.n)]
            for r, out in enumerate(res):
                where = f"{case.describe(g.n)}, rank {r}"
                if not isinstance(out["y"], torch.Tensor):
                    return f"{g.name}.apply(x, group) returned {out['y']}, not a tensor ({where})."
                want_y = xs[r] if which == "f" else _group_sum(xs, case, r)
                want_dx = _group_sum(dys, case, r) if which == "f" else dys[r]
                size = 2 if case.groups == "pairs" else g.n
                for name, got, want in (("forward output", out["y"], want_y),
                                        ("gradient of x", out["dx"], want_dx)):
                    if got is None:
                        return (f"{g.name}: x got no gradient ({where}): backward must return the "
                                "gradient for x (and None for group).")
                    try:
                        check.assert_close(got, want, name=name, rank=r)
                    except AssertionError as err:
                        return (f"{g.name} is wrong for {where}.\n{err}\nHint: "
                                + _hint(which, name, got, xs[r] if name[0] == "f" else dys[r],
                                        want, size, case))
        return None
    return grade


def _hint(which: str, name: str, got, own, want, size: int, case: Case) -> str:
    group = (" Sum over the group you are given (here each pair of ranks), not the whole world: "
             "pass group=group to dist.all_reduce." if case.groups == "pairs" else "")
    if which == "f" and name == "forward output":
        return ("f's forward is the identity: return x as it is. Summing in forward is g's job "
                "(did you swap f and g?).")
    if which == "g" and name == "gradient of x":
        if check.same_values(got, size * want):
            return (f"the gradient is {size} x the upstream gradient: g's backward is the identity "
                    "(the all-reduce in backward is f's; did you swap f and g?).")
        return "g's backward returns the upstream gradient unchanged."
    if check.same_values(got, own):
        return ("this rank's own value came back unchanged: the all-reduce is missing"
                + (" in backward (f's backward sums the gradient over the group)." if which == "f"
                   else " in forward (g's forward sums x over the group).") + group)
    return "the sum must run over the ranks of `group`." + group


# ---------------------------------------------------------------- rules
def _one_all_reduce(which: str):
    def broken(records, case, n):
        for r, rec in enumerate(records):
            forward, backward = calls(rec, backward=False), calls(rec, backward=True)
            want_fwd, want_bwd = (0, 1) if which == "f" else (1, 0)
            wrong = [op for op in ops(rec) if op != "all_reduce"]
            if wrong:
                return f"rank {r} called dist.{wrong[0]}."
            if len(forward) != want_fwd or len(backward) != want_bwd:
                return (f"rank {r} made {len(forward)} all-reduce(s) in forward and {len(backward)} in "
                        f"backward; {which} makes {want_fwd} and {want_bwd}.")
        return None
    return broken


def _in_place(records, case, n):
    for r, rec in enumerate(records):
        if rec["mutated"]:
            what = " and ".join({"x": "its input x", "dy": "the upstream gradient",
                                 "grad": "the gradient handed to backward"}.get(m, m)
                                for m in rec["mutated"])
            return (f"rank {r} modified {what} in place (an in-place dist.all_reduce on the tensor "
                    "it was given?). The caller still owns that tensor, and autograd may reuse "
                    "it: all-reduce a copy (.clone()) and return that.")
    return None


NOT_IN_PLACE = Rule("Do not modify the incoming tensor in place: forward leaves `x` and backward "
                    "leaves the incoming gradient as they came (all-reduce a copy).", _in_place)

F = Exercise(key="lab03.f", answer="CopyToParallel", run=run, grade=grader("f"), visible=VISIBLE_F,
             hidden=(), rules=(Rule("f makes exactly one `dist.all_reduce`, in backward, on `group`; no "
                                    "other collective.", _one_all_reduce("f")), NOT_IN_PLACE),
             timeout=TIMEOUT, kind="class", on_hang=HANG)
G = Exercise(key="lab03.g", answer="ReduceFromParallel", run=run, grade=grader("g"), visible=VISIBLE_G,
             hidden=(), rules=(Rule("g makes exactly one `dist.all_reduce`, in forward, on `group`; no "
                                    "other collective.", _one_all_reduce("g")), NOT_IN_PLACE),
             timeout=TIMEOUT, kind="class", on_hang=HANG)
