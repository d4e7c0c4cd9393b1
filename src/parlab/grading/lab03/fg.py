"""Lab 03, exercises 1a and 1b: f and g, Megatron's two conjugate autograd Functions.

``f`` (``CopyToParallel``) is the identity in forward and all-reduces the
gradient over ``group`` in backward; ``g`` (``ReduceFromParallel``) is the
other way round.  Each rank calls ``cls.apply(x, group)`` on its own x with
its own upstream gradient (f's differ per rank; g's are the same on every
rank, as after g in a model), with the world or pairs of ranks as the group.
The grader sums the group's tensors itself; a hint names a mistake (f and g
swapped, the all-reduce missing, the group ignored) only when every rank
returned what that mistake gives (``diagnosis.diagnose``), else it says
which ranks differ and by what ratio; the rules read
the collectives made in forward and in backward, and whether x or the
gradient was changed in place.
"""
from __future__ import annotations

import torch

from ... import check
from ..diagnosis import diagnose, ratio_words
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
                if not isinstance(out["y"], torch.Tensor):
                    return (f"{g.name}.apply(x, group) returned {out['y']}, not a tensor "
                            f"({case.describe(g.n)}, rank {r}).")
            # what each rank must return: (forward output, gradient of x)
            wants = [(xs[r] if which == "f" else _group_sum(xs, case, r),
                      _group_sum(dys, case, r) if which == "f" else dys[r]) for r in range(g.n)]
            for k, name in enumerate(("forward output", "gradient of x")):
                for r, out in enumerate(res):
                    got = out["y" if k == 0 else "dx"]
                    if got is None:
                        return (f"{g.name}: x got no gradient ({case.describe(g.n)}, rank {r}): "
                                "backward must return the gradient for x (and None for group).")
                    try:
                        check.assert_close(got, wants[r][k], name=name, rank=r)
                    except AssertionError as err:
                        key, other = ("y", "dx") if k == 0 else ("dx", "y")
                        return (f"{g.name} is wrong for {case.describe(g.n)}, rank {r}.\n{err}\nHint: "
                                + _hint(which, name, case, [o[key] for o in res], xs if k == 0 else dys,
                                        [w[k] for w in wants],
                                        _summed([o[other] for o in res], dys if k == 0 else xs, case)))
        return None
    return grade


def _fits(got: list, want: list) -> bool:
    """Every rank's tensor equals the one a mistake gives on that rank."""
    return all(isinstance(t, torch.Tensor) and t.shape == w.shape and check.same_values(t, w)
               for t, w in zip(got, want))


def _summed(got: list, own: list, case: Case) -> bool | None:
    """Whether every rank's tensor is the sum over its group of ``own`` (True), ``own`` itself
    (False), or neither (None)."""
    if _fits(got, [_group_sum(own, case, r) for r in range(len(got))]):
        return True
    return False if _fits(got, own) else None


def _hint(which: str, name: str, case: Case, got: list, own: list, want: list, other: bool | None) -> str:
    """What every rank's ``got`` (the wrong tensor) shows, against each rank's ``own`` input (x or
    the upstream gradient) and ``want``, and whether the other pass summed (``other``, from
    ``_summed``): a mistake is named only when its value is what every rank returned
    (``diagnosis.diagnose``), else the message says which ranks differ and by what ratio."""
    n = len(got)
    sums = [_group_sum(own, case, r) for r in range(n)]
    world = [torch.stack(own).sum(0)] * n
    summing = (which, name) in (("f", "gradient of x"), ("g", "forward output"))
    if summing:  # f's backward, g's forward: a sum over the group
        where = (" in backward (f's backward sums the gradient over the group)." if which == "f"
                 else " in forward (g's forward sums x over the group).")
        signatures = {
            "missing": (own, "every rank's own value came back unchanged: the all-reduce is missing" + where),
            "world": (world, "every rank holds the sum over ALL ranks, not over its group (the groups "
                             "here are pairs of ranks): pass group=group to dist.all_reduce."),
        }
    else:  # f's forward, g's backward: the identity
        this, that = ("forward", "backward") if which == "f" else ("backward", "forward")
        signatures = {"world": (world, f"every rank's {name} is the sum over all ranks; {which}'s {this} "
                                       "is the identity.")}
        if other is False:  # the sum is here, and the other pass, which should sum, did not
            signatures["swapped"] = (sums, f"your {which} sums over the group in {this} and passes "
                                           f"{that} through unchanged: that is the other Function "
                                           "(did you swap f and g?).")
        elif other is True:  # the other pass sums, as it should, and this one sums as well
            signatures["twice"] = (sums, f"{which}'s {this} is the identity: your {which} sums over the "
                                         f"group in {that} (right) and again in {this}.")
    named = diagnose([{k: s for k, (value, s) in signatures.items()
                       if (k != "world" or case.groups == "pairs") and _fits(got, value)}])
    if named:
        return named
    bad = [r for r in range(n) if not _fits(got[r:r + 1], want[r:r + 1])] or list(range(n))
    scale = check.grad_scale({"t": got[bad[0]]}, {"t": want[bad[0]]}) if isinstance(got[bad[0]], torch.Tensor) else None
    same = scale and all(abs((check.grad_scale({"t": got[r]}, {"t": want[r]}) or 0) / scale - 1) < 1e-3
                         for r in bad)
    ratio = f" (each is {ratio_words(scale)} the right one)" if same else ""
    right = ("the sum of " + ("the upstream gradient" if which == "f" else "x") + " over the ranks of `group`"
             if summing else ("x as it came" if name == "forward output" else "the upstream gradient unchanged"))
    return (f"the {name} is wrong on {check.ranks_phrase(bad)} of {n}{ratio}; {which}'s "
            f"{'backward' if name != 'forward output' else 'forward'} returns {right}.")


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
