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
gradient on the rank that holds it against the sum over every rank's batch
(an expert sees every token routed to it, from every rank); the router's
gradients summed over the ranks against the reference's sum (data
parallelism's all-reduce would sum them; the layer itself leaves them per
rank).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ... import check
from ...models.moe import tiny_moe
from ..harness import Graded, Rule
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

    def describe(self, n: int) -> str:
        cap = f", capacity_factor {self.capacity}" if self.capacity else ""
        quiet = f", experts {list(self.silent)} receive no tokens" if self.silent else ""
        return (f"{self.tokens} tokens per rank, d_model {self.d}, {self.experts} experts, "
                f"top_k {self.top_k}{cap}{quiet}, world_size {n}")

    def moe(self):
        return tiny_moe(self.d, self.ff, self.experts, self.top_k, self.capacity, seed=self.seed,
                        silent=self.silent)

    def tokens_of(self, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(x, upstream gradient) of one rank."""
        g = torch.Generator().manual_seed(9000 + 100 * self.seed + rank)
        x = torch.randn(self.tokens, self.d, generator=g, dtype=torch.float64)
        return x, torch.randn(self.tokens, self.d, generator=g, dtype=torch.float64)


def reference(case: MoECase, n: int, weighted: bool = True) -> dict:
    """Outputs and input gradients per rank; parameter gradients summed over the ranks' batches.

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
        outs, dxs = [], []
        for r in range(n):
            x, dy = case.tokens_of(r)
            x.requires_grad_()
            y = moe(x)
            y.backward(dy)
            outs.append(y.detach())
            dxs.append(x.grad)
    finally:
        if not weighted:
            moe_module.route = route
    grads = {k: (p.grad if p.grad is not None else torch.zeros_like(p)) for k, p in moe.named_parameters()}
    return {"out": outs, "dx": dxs, "grads": grads}


# ---------------------------------------------------------------- on the ranks
def run(cls, case: MoECase, i: int, spy) -> dict:
    import torch.distributed as dist

    rank = dist.get_rank()
    x, dy = case.tokens_of(rank)
    leaf = x.clone().requires_grad_()
    given = leaf * 1
    spy.guard(x=given)
    with spy.watch(), recorder.watching(spy):
        layer = cls(case.moe())
        out = layer(given)
        if not isinstance(out, torch.Tensor):
            return {"out": repr(out)[:100]}
        spy.note("backward")
        if out.requires_grad and out.shape == given.shape:
            out.backward(dy)
    grads = {k: (p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p.detach()))
             for k, p in layer.named_parameters()}
    return {"out": out.detach().clone(), "dx": None if leaf.grad is None else leaf.grad.clone(),
            "grads": grads}


def settle(result: dict, case: MoECase, i: int, n: int) -> bool:
    import torch.distributed as dist

    if not isinstance(result.get("out"), torch.Tensor):
        return False
    rank, ref = dist.get_rank(), reference(case, n)
    per = case.experts // n
    experts_right = all(check.same_values(g, ref["grads"][name]) for k, g in result["grads"].items()
                        if (name := _global_name(k, rank, per)) in ref["grads"])
    return (check.same_values(result["out"], ref["out"][rank]) and check.same_values(result["dx"], ref["dx"][rank])
            and experts_right)


# ---------------------------------------------------------------- grader
def _global_name(local: str, rank: int, per: int) -> str | None:
    """'experts.1.up.weight' on rank r -> 'experts.{r·per + 1}.up.weight'."""
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
    equal = [e for rec in records for e in recorder.events(rec, "a2a") if e["dtype"].startswith("float")
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


def _grads(g: Graded, case: MoECase, res: list, ref: dict) -> str | None:
    per = case.experts // g.n
    for r, o in enumerate(res):
        names = [k for k in o["grads"] if _global_name(k, r, per)]
        if len(names) != 4 * per:
            return (f"rank {r} holds {len(names) // 4} experts under self.experts; it holds exactly its "
                    f"{per} (experts {r * per} to {r * per + per - 1}).")
        for k in names:
            want = ref["grads"][_global_name(k, r, per)]
            try:
                check.assert_close(o["grads"][k], want, name=f"{k} gradient", rank=r)
            except AssertionError as err:
                hint = (" Hint: an expert lives on one rank and sees every token routed to it, so its "
                        "gradient is complete there: it must not be summed (all-reduced) over the "
                        "ranks; across the world that adds other experts' gradients into it."
                        if _all_equal([res[j]["grads"][k] for j in range(g.n)]) else "")
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


def _all_to_all_only(records, case, n):
    for r, rec in enumerate(records):
        other = [c["op"] for c in rec["calls"] if c["op"] not in A2A]
        if other:
            return (f"rank {r} called dist.{other[0]}: the tokens travel by all-to-all, each rank sending "
                    "each other rank only the tokens for its experts (a broadcast or all-gather sends "
                    "every token everywhere).")
    return None


def _counts_first(records, case, n):
    for r, rec in enumerate(records):
        forward = [c for c in rec["calls"] if not c["in_backward"]]
        if forward and not forward[0]["dtype"].startswith(("int", "long")):
            return (f"rank {r}'s first all-to-all in forward carried {forward[0]['dtype']} data: exchange "
                    "the per-rank counts first (an integer tensor), so every rank can size its receive "
                    "buffer and split sizes before the payload.")
    return None


RULES = (
    Rule("The tokens travel by all-to-all (`dist.all_to_all_single` or `dist.all_to_all`): no broadcast, "
         "all-gather or all-reduce of the tokens.", _all_to_all_only),
    Rule("The counts are exchanged before the payload: the first all-to-all in forward carries the "
         "integer counts.", _counts_first),
)

ON_HANG = ("the ranks waited for each other in an all-to-all. Every rank must make the same all-to-alls, "
           "in backward too: a rank whose experts received no tokens still takes part, so keep its (empty) "
           "results connected to the autograd graph (for example start from 0 * arrived, not torch.zeros).")

VISIBLE = ((2, (MoECase(), MoECase(tokens=7, experts=4, top_k=1, silent=(1,), seed=1),
                MoECase(tokens=8, capacity=1.0, seed=2))),)
HIDDEN = ((4, (MoECase(tokens=5, experts=8, seed=3), MoECase(tokens=6, experts=4, capacity=0.75, seed=4),
               MoECase(tokens=4, experts=4, silent=(0, 3), seed=5))),)
