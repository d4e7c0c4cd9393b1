"""Lab 07, exercise 3: expert parallelism, its cases, the reference, the grader and the rules.

The student's ``cls(moe, group=None)`` keeps ``moe``'s router (as
``self.router``) and only this rank's experts, E/n consecutive ones (as
``self.experts``, a ModuleList: rank r holds experts r·E/n ... (r+1)·E/n − 1).
Called on this rank's tokens (T, d), it routes them with
``parlab.models.moe.route``, sends each assignment to the rank that holds its
expert with all-to-all, runs its experts and sends the results back.

The reference is ``parlab.models.moe.MoE`` in one process, called on each
rank's tokens in turn (the capacity rule counts one rank's batch, as GShard's
groups do).  Compared: every rank's output and input gradient; each expert's
gradient on the rank that holds it against the sum over the batches of its
group's ranks (an expert sees every token routed to it, from every rank of
its group); the router's gradients summed over the ranks against the
reference's sum (data parallelism's all-reduce would sum them; the layer
itself leaves them per rank).

Some cases cut the world into groups of ``group_size`` consecutive ranks, the
EP groups of ``Grid.of(dp=n // group_size, ep=group_size)``, and pass each rank
its group (as section 6's (dp, ep) device mesh does); one gives the ranks
different numbers of tokens (``uneven``); one has E not divisible by the
group's size, where constructing the layer must raise a ValueError that names
both numbers.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ... import check
from ...models.moe import tiny_moe
from ...parallel.mesh import Grid
from ..harness import Graded, Rule
from ..plain import plain
from ..records import calls, describe, events
from . import recorder


@dataclass(frozen=True)
class MoECase:
    tokens: int = 6          # per rank
    d: int = 6
    ff: int = 8
    experts: int = 4
    top_k: int = 2
    capacity: float | None = None
    silent: tuple = ()       # experts no token picks
    seed: int = 0
    group_size: int | None = None  # ranks cut into groups of this many, each rank given its group
    uneven: bool = False     # rank r has tokens + r tokens

    def describe(self, n: int) -> str:
        cap = f", capacity_factor {self.capacity}" if self.capacity else ""
        quiet = f", experts {list(self.silent)} receive no tokens" if self.silent else ""
        count = f"{self.tokens} + rank tokens on each rank" if self.uneven else f"{self.tokens} tokens per rank"
        where = (f"world_size {n}, each rank given group= its group of {self.group_size} ranks"
                 if self.group_size else f"world_size {n}")
        return f"{count}, d_model {self.d}, {self.experts} experts, top_k {self.top_k}{cap}{quiet}, {where}"

    def members(self, n: int, rank: int) -> list[int]:
        """The ranks of ``rank``'s group (the whole world without ``group_size``)."""
        size = self.group_size or n
        first = rank // size * size
        return list(range(first, first + size))

    def divides(self, n: int) -> bool:
        return self.experts % (self.group_size or n) == 0

    def moe(self):
        return tiny_moe(self.d, self.ff, self.experts, self.top_k, self.capacity, seed=self.seed,
                        silent=self.silent)

    def tokens_of(self, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(x, upstream gradient) of one rank."""
        g = torch.Generator().manual_seed(9000 + 100 * self.seed + rank)
        t = self.tokens + (rank if self.uneven else 0)
        x = torch.randn(t, self.d, generator=g, dtype=torch.float64)
        return x, torch.randn(t, self.d, generator=g, dtype=torch.float64)


def reference(case: MoECase, n: int, weighted: bool = True) -> dict:
    """Outputs, input gradients and parameter gradients per rank (``per_rank``), and the parameter
    gradients summed over all ranks' batches (``grads``).

    ``weighted=False`` is the same layer with the router's weights left out (all 1), for the hint.
    """
    moe = case.moe()
    if not weighted:
        from ...models import moe as moe_module
        route = moe_module.route

        def unweighted(*args, **kw):
            e, w, kept = route(*args, **kw)
            return e, torch.ones_like(w), kept
        moe_module.route = unweighted
    try:
        outs, dxs, per_rank = [], [], []
        for r in range(n):
            x, dy = case.tokens_of(r)
            x.requires_grad_()
            moe.zero_grad(set_to_none=True)
            y = moe(x)
            y.backward(dy)
            outs.append(y.detach())
            dxs.append(x.grad)
            per_rank.append({k: (p.grad if p.grad is not None else torch.zeros_like(p))
                             for k, p in moe.named_parameters()})
    finally:
        if not weighted:
            moe_module.route = route
    return {"out": outs, "dx": dxs, "per_rank": per_rank, "grads": _summed(per_rank, range(n))}


def _summed(per_rank: list, ranks) -> dict:
    """Parameter gradients summed over ``ranks``' batches, in rank order."""
    ranks = list(ranks)
    total = dict(per_rank[ranks[0]])
    for r in ranks[1:]:
        total = {k: total[k] + per_rank[r][k] for k in total}
    return total


def expert_grads(case: MoECase, ref: dict, n: int, rank: int) -> dict:
    """What the experts' gradients on ``rank`` must be: summed over its group's batches."""
    return _summed(ref["per_rank"], case.members(n, rank))


_GROUPS: dict = {}


def _group(case: MoECase, rank: int, n: int):
    """This rank's EP group under ``case.group_size``; every rank makes every group once per launch."""
    grid = Grid.of(dp=n // case.group_size, ep=case.group_size)
    if case.group_size not in _GROUPS:
        import torch.distributed as dist

        _GROUPS[case.group_size] = [dist.new_group(ranks) for ranks in grid.groups("ep")]
    return _GROUPS[case.group_size][grid.coords(rank)["dp"]]


# ---------------------------------------------------------------- on the ranks
def run(cls, case: MoECase, i: int, spy) -> dict:
    import torch.distributed as dist

    rank, n = dist.get_rank(), dist.get_world_size()
    x, dy = case.tokens_of(rank)  # (T_r, d): this rank's own tokens, T_r = tokens (+ rank if uneven)
    leaf = x.clone().requires_grad_()
    given = leaf * 1
    spy.guard(x=given)
    extra = {"group": _group(case, rank, n)} if case.group_size else {}
    if not case.divides(n):
        with spy.watch():
            try:
                cls(case.moe(), **extra)
            except ValueError as err:
                return {"out": None, "raised": f"ValueError: {err}"[:300]}
        return {"out": None, "raised": None}
    with spy.watch(), recorder.watching(spy):
        layer = cls(case.moe(), **extra)
        out = layer(given)
        if not isinstance(out, torch.Tensor):
            return {"out": repr(out)[:100]}
        spy.note("backward")
        if out.requires_grad and out.shape == given.shape:
            out.backward(dy)
    # out, dx: (T_r, d); grads: of the parameters this rank's layer holds (its share of the experts)
    grads = {k: plain(p.grad if p.grad is not None else torch.zeros_like(p))
             for k, p in layer.named_parameters()}
    return {"out": plain(out), "dx": plain(leaf.grad), "grads": grads}


def settle(result: dict, case: MoECase, i: int, n: int) -> bool:
    import torch.distributed as dist

    if not case.divides(n):
        return bool(result.get("raised"))
    if not isinstance(result.get("out"), torch.Tensor):
        return False
    rank, ref = dist.get_rank(), reference(case, n)
    members = case.members(n, rank)
    per, want = case.experts // len(members), expert_grads(case, ref, n, rank)
    experts_right = all(check.same_values(g, want[name]) for k, g in result["grads"].items()
                        if (name := _global_name(k, members.index(rank), per)) in want)
    return (check.same_values(result["out"], ref["out"][rank]) and check.same_values(result["dx"], ref["dx"][rank])
            and experts_right)


# ---------------------------------------------------------------- grader
def _global_name(local: str, rank: int, per: int) -> str | None:
    """'experts.1.up.weight' on (group) rank r -> 'experts.{r·per + 1}.up.weight'."""
    parts = local.split(".")
    if parts[0] != "experts" or len(parts) < 3 or not parts[1].isdigit():
        return None
    return ".".join(["experts", str(rank * per + int(parts[1]))] + parts[2:])


def _out_hint(g: Graded, case: MoECase, i: int, got: list, ref: dict) -> str:
    unweighted = reference(case, g.n, weighted=False)["out"]
    if all(check.same_values(t, u) for t, u in zip(got, unweighted)):
        return ("the outputs are the experts' results with weight 1: the router's weights are not "
                "applied. Multiply each expert's result by the token's router probability for it "
                "before adding it to the token's output.")
    if all(check.same_values(t.sum(0), w.sum(0)) for t, w in zip(got, ref["out"])):
        return ("every token's results came back, but to the wrong tokens: the combine is in the wrong "
                "order. Undo the dispatch's sort: the all-to-all returns results in the order you sent "
                "the assignments, so add each one back at the token (and slot) it came from.")
    records = [per_rank[i] for per_rank in g.records]
    equal = [e for rec in records for e in events(rec, "a2a", backward=False) if e["dtype"].startswith("float")
             and not e["splits"]]
    if equal:
        return ("the payload's all-to-all was called without split sizes, as if every rank sent every "
                "other rank the same number of tokens: uneven splits were assumed equal. Pass "
                "output_split_sizes and input_split_sizes from the exchanged counts.")
    return ("compare with MoE.forward: route with parlab.models.moe.route (the capacity rule counts this "
            "rank's tokens), send assignment j to rank expert // (E / n), and combine with the weights.")


def grade(g: Graded) -> str | None:
    done = min(len(r) for r in g.results)
    for i, case in enumerate(g.cases[:done]):
        res, where = g.at(i), case.describe(g.n)
        if not case.divides(g.n):
            message = _indivisible(g, case, res)
            if message:
                return message
            continue
        bad = [(r, o) for r, o in enumerate(res) if not isinstance(o.get("out"), torch.Tensor)]
        if bad:
            return f"{g.name} returned {bad[0][1]['out']} on rank {bad[0][0]}, not a tensor ({where})."
        ref = reference(case, g.n)
        got = [o["out"] for o in res]
        for r, t in enumerate(got):
            try:
                check.assert_close(t, ref["out"][r], name="output", rank=r)
            except AssertionError as err:
                return f"{g.name}'s output is wrong for {where}.\n{err}\nHint: " + _out_hint(g, case, i, got, ref)
        for r, o in enumerate(res):
            if o["dx"] is None:
                return (f"the input got no gradient on rank {r} ({where}): the all-to-all needs an autograd "
                        "Function whose backward is the reverse all-to-all.")
            try:
                check.assert_close(o["dx"], ref["dx"][r], name="gradient of the input", rank=r)
            except AssertionError as err:
                return (f"{g.name}'s input gradient is wrong for {where}.\n{err}\nHint: backward sends each "
                        "result's gradient back along the combine's all-to-all, then the dispatch's.")
        message = _grads(g, case, res, ref)
        if message:
            return f"{g.name}'s parameter gradients are wrong for {where}.\n{message}"
    return None


def _indivisible(g: Graded, case: MoECase, res: list) -> str | None:
    size = case.group_size or g.n
    for r, o in enumerate(res):
        raised = o.get("raised")
        if not raised:
            return (f"{g.name}(moe) with {case.experts} experts on {size} ranks built a layer on rank {r}; "
                    f"{case.experts} experts do not split evenly over {size} ranks, so raise a ValueError "
                    f"that says so (naming {case.experts} and {size}).")
        if str(case.experts) not in raised or str(size) not in raised:
            return (f"{g.name}(moe) with {case.experts} experts on {size} ranks raised {raised!r} on rank {r}: "
                    f"right, but name both numbers ('{case.experts} experts are not divisible by "
                    f"{size} ranks').")
    return None


def _grads(g: Graded, case: MoECase, res: list, ref: dict) -> str | None:
    for r, o in enumerate(res):
        members = case.members(g.n, r)
        mine, per = members.index(r), case.experts // len(members)
        names = [k for k in o["grads"] if _global_name(k, mine, per)]
        if len(names) != 4 * per:
            held = len(names) // 4
            hint = (f" That is E / world size: split the experts over the ranks of `group` "
                    "(dist.get_world_size(group), dist.get_rank(group)) and pass group= to every "
                    "all-to-all." if case.group_size and held == case.experts // g.n else "")
            return (f"rank {r} holds {held} experts under self.experts; it holds exactly its "
                    f"{per} (experts {mine * per} to {mine * per + per - 1}).{hint}")
        want = expert_grads(case, ref, g.n, r)
        for k in names:
            try:
                check.assert_close(o["grads"][k], want[_global_name(k, mine, per)], name=f"{k} gradient", rank=r)
            except AssertionError as err:
                hint = (" Hint: an expert lives on one rank and sees every token routed to it, so its "
                        "gradient is complete there: it must not be summed (all-reduced) over the "
                        "ranks; across the world that adds other experts' gradients into it."
                        if _all_equal([res[j]["grads"][k] for j in members]) else "")
                return f"{err}{hint}"
    for k in ("router.weight", "router.bias"):
        if any(k not in o["grads"] for o in res):
            return f"the layer has no parameter '{k}': keep the router as self.router."
        total = torch.stack([o["grads"][k] for o in res]).sum(0)
        try:
            check.assert_close(total, ref["grads"][k], name=f"{k} gradient summed over the ranks")
        except AssertionError as err:
            hint = (" Hint: every rank holds the router's full sum already: leave the router's gradient "
                    "per rank (data parallelism's all-reduce sums it later)."
                    if check.same_values(total, g.n * ref["grads"][k]) else "")
            return f"{err}{hint}"
    return None


def _all_equal(tensors: list) -> bool:
    return len(tensors) > 1 and all(check.same_values(t, tensors[0]) for t in tensors[1:])


# ---------------------------------------------------------------- rules
A2A = ("all_to_all_single", "all_to_all")


def _carries_tokens(call: dict, case: MoECase) -> bool:
    """Whether a collective's tensor can be tokens (or their gradients): floating point, a whole number
    of d_model-wide rows, and, in backward, not the router's gradient (E × d_model or E elements)."""
    if not str(call["dtype"]).startswith(("float", "bfloat")) or not call["numel"] or call["numel"] % case.d:
        return False
    return not call["in_backward"] or call["numel"] not in (case.experts * case.d, case.experts)


def _all_to_all_only(records, case, n):
    for r, rec in enumerate(records):
        other = [c for c in calls(rec) if c["op"] not in A2A and _carries_tokens(c, case)]
        if other:
            rows = other[0]["numel"] // case.d
            return (f"rank {r} called {describe(rec, other[0])}, {rows} rows of d_model {case.d}: the "
                    "tokens travel by all-to-all, each rank sending each other rank only the tokens for "
                    "its experts (a broadcast or all-gather sends every token everywhere).")
    return None


def _counts_first(records, case, n):
    for r, rec in enumerate(records):
        forward = calls(rec, backward=False)
        if forward and not forward[0]["dtype"].startswith(("int", "long")):
            return (f"rank {r}'s first all-to-all in forward carried {forward[0]['dtype']} data: exchange "
                    "the per-rank counts first (an integer tensor), so every rank can size its receive "
                    "buffer and split sizes before the payload.")
    return None


RULES = (
    Rule("The tokens travel by all-to-all (`dist.all_to_all_single` or `dist.all_to_all`): no broadcast, "
         "all-gather or all-reduce of the tokens.", _all_to_all_only),
    Rule("The counts are exchanged before the payload: the first all-to-all in forward carries the "
         "integer counts (a signed integer tensor such as `torch.int64`; one count per expert or per "
         "destination rank, as you like).", _counts_first),
)

ON_HANG = ("the ranks waited for each other in an all-to-all. Every rank must make the same all-to-alls, "
           "in backward too: a rank whose experts received no tokens still takes part, so keep its (empty) "
           "results connected to the autograd graph (for example start from 0 * arrived, not torch.zeros).")

VISIBLE = ((2, (MoECase(), MoECase(tokens=7, experts=4, top_k=1, silent=(1,), seed=1),
                MoECase(tokens=8, capacity=1.0, seed=2), MoECase(tokens=5, uneven=True, capacity=1.0, seed=6),
                MoECase(tokens=5, group_size=1, seed=7), MoECase(experts=3, seed=8))),)
HIDDEN = ((4, (MoECase(tokens=5, experts=8, seed=3), MoECase(tokens=6, experts=4, capacity=0.75, seed=4),
               MoECase(tokens=4, experts=4, silent=(0, 3), seed=5),
               MoECase(tokens=4, experts=4, group_size=2, uneven=True, seed=9), MoECase(experts=6, seed=10))),)
