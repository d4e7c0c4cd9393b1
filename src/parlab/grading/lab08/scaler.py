"""Lab 08, Exercise 1: a dynamic loss scaler for sharded data parallelism.

The student writes ``LossScaler(init_scale, growth_factor, backoff_factor,
growth_interval)`` with ``scale(loss)``, ``step(optimizer)``, ``update()``
and ``get_scale()``, the shape of ``torch.amp.GradScaler``.  On every rank
the check gives the scaler one parameter that only this rank holds (its
shard of the model, as after ZeRO-2's or FSDP's reduce-scatter), trains it
with SGD for a few steps, and at chosen steps writes an inf or a NaN into one
rank's scaled gradient, as an fp16 backward that overflowed would.

The reference is one process holding every rank's shard, scaled by
``torch.amp.GradScaler`` with the same settings: it skips a step when any
gradient is not finite, so every rank must skip it too.  Scaling, overflow
handling and growth follow Micikevicius et al. 2018, "Mixed Precision
Training" (ICLR), §3.2, and ``torch.amp.GradScaler``'s documentation.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from ... import check
from ...launch.runtime import device
from .. import records as read
from ..harness import Graded, Rule
from ..plain import plain
from .rules import one_small_collective

BACKOFF, GROWTH = 0.5, 2.0


@dataclass(frozen=True)
class ScalerCase:
    """``steps`` SGD steps; ``overflows``: ((step, rank, "inf" or "nan"), ...) written into a gradient."""

    steps: int
    growth_interval: int
    overflows: tuple
    init_scale: float = 2.0 ** 10
    lr: float = 0.25
    seed: int = 8

    def describe(self, n: int) -> str:
        bad = ", ".join(f"{k} in rank {r}'s gradient at step {s}" for s, r, k in self.overflows)
        return (f"{self.steps} steps from scale {self.init_scale:g}, growth_interval "
                f"{self.growth_interval}, {bad}, world_size {n}")

    def size(self, rank: int) -> int:
        return 3 + rank  # every rank's shard a different size

    def start(self, rank: int) -> torch.Tensor:
        return torch.randn(self.size(rank), generator=torch.Generator().manual_seed(self.seed * 100 + rank))

    def data(self, step: int, rank: int) -> torch.Tensor:
        g = torch.Generator().manual_seed(self.seed * 10_000 + step * 10 + rank)
        return torch.randn(self.size(rank), generator=g)

    def spoil(self, grad: torch.Tensor, step: int, rank: int) -> None:
        for s, r, kind in self.overflows:
            if (s, r) == (step, rank):
                grad[0] = float("inf") if kind == "inf" else float("nan")

    def bad_at(self, step: int) -> list[tuple[int, str]]:
        return [(r, k) for s, r, k in self.overflows if s == step]


def reference(case: ScalerCase, n: int) -> dict:
    """One process, every rank's shard, ``torch.amp.GradScaler``: the scale and each shard after every step."""
    params = [nn.Parameter(case.start(r)) for r in range(n)]
    opt = torch.optim.SGD(params, lr=case.lr)
    scaler = torch.amp.GradScaler("cpu", init_scale=case.init_scale, growth_factor=GROWTH,
                                  backoff_factor=BACKOFF, growth_interval=case.growth_interval)
    scales, values = [], []
    for s in range(case.steps):
        loss = sum((p * case.data(s, r)).sum() for r, p in enumerate(params))
        scaler.scale(loss).backward()
        for r, p in enumerate(params):
            case.spoil(p.grad, s, r)
        scaler.step(opt)
        scaler.update()
        scales.append(float(scaler.get_scale()))
        values.append([p.detach().clone() for p in params])
        opt.zero_grad()
    return {"scales": scales, "values": values}


# ---------------------------------------------------------------- on the ranks
def run(cls, case: ScalerCase, i: int, spy) -> dict:
    import torch.distributed as dist

    rank = dist.get_rank()
    p = nn.Parameter(case.start(rank).to(device()))       # this rank's shard: no other rank holds it
    opt = torch.optim.SGD([p], lr=case.lr)
    with spy.watch():
        scaler = cls(init_scale=case.init_scale, growth_factor=GROWTH, backoff_factor=BACKOFF,
                     growth_interval=case.growth_interval)
    scales, values = [], []
    for s in range(case.steps):
        x = case.data(s, rank).to(device())
        with spy.watch():
            scaled = scaler.scale((p * x).sum())
        scaled.backward()
        case.spoil(p.grad, s, rank)                       # the overflow an fp16 backward would make
        with spy.watch():
            scaler.step(opt)
            scaler.update()
            spy.note("step")
        scales.append(float(scaler.get_scale()))
        values.append(p.detach().cpu().clone())
        opt.zero_grad()
    return {"scales": plain(scales), "values": plain(values)}


def _right(res: dict, want: dict, rank: int) -> bool:
    return (list(res["scales"]) == want["scales"]
            and all(isinstance(v, torch.Tensor) and v.shape == w[rank].shape
                    and bool(check.close_mask(v, w[rank]).all()) for v, w in zip(res["values"], want["values"])))


def settle(result: dict, case: ScalerCase, i: int, n: int) -> bool:
    import torch.distributed as dist

    return _right(result, reference(case, n), dist.get_rank())


# ---------------------------------------------------------------- in the grader
def _close(a, b) -> bool:
    return isinstance(a, torch.Tensor) and a.shape == b.shape and bool(check.close_mask(a, b).all())


def grade(g: Graded) -> str | None:
    for i, case in enumerate(g.cases[:min(len(r) for r in g.results)]):
        want = reference(case, g.n)
        results = g.at(i)
        for s in range(case.steps):
            for r, res in enumerate(results):
                got_v, got_s = res["values"][s], res["scales"][s]
                if _close(got_v, want["values"][s][r]) and got_s == want["scales"][s]:
                    continue
                return _explain(g, case, results, want, s, r)
    return None


def _explain(g: Graded, case: ScalerCase, results: list, want: dict, s: int, r: int) -> str:
    head = f"{g.name} is wrong for {case.describe(g.n)}: at step {s}, on rank {r},"
    res = results[r]
    got_v, got_s, want_s = res["values"][s], res["scales"][s], want["scales"][s]
    before = want["values"][s - 1][r] if s else case.start(r)  # every earlier step was right
    prev_scale = want["scales"][s - 1] if s else case.init_scale
    bad = case.bad_at(s)
    if isinstance(got_v, torch.Tensor) and got_v.shape == before.shape:
        stepped = not _close(got_v, before)
        for q, k in bad:  # a rank that stepped on its own overflow comes first
            q_before = want["values"][s - 1][q] if s else case.start(q)
            if not _close(results[q]["values"][s], q_before):
                head = f"{g.name} is wrong for {case.describe(g.n)}: at step {s}, on rank {q},"
                if k == "nan" and _skipped_an_inf(case, results, want):
                    return (f"{head} the optimizer stepped although this rank's gradient held a NaN, "
                            "where it skipped the step on an inf. A test for inf alone (math.isinf, "
                            "torch.isinf) misses NaN: test with torch.isfinite, which is False for both.")
                if k == "nan":
                    return (f"{head} the optimizer stepped although this rank's gradient held a NaN: "
                            "skip optimizer.step() when any gradient is not finite (torch.isfinite is "
                            "False for inf and NaN).")
                return (f"{head} the optimizer stepped although this rank's gradient held an inf: "
                        "skip optimizer.step() when an overflow was found.")
        others = [(q, k) for q, k in bad if q != r]
        if stepped and others and not any(q == r for q, _ in bad):
            q, k = others[0]
            return (f"{head} the optimizer stepped although rank {q}'s gradient held an {k} (an "
                    f"overflow). Your scaler looked at its own rank's gradients only: rank {q} "
                    f"skipped the step and rank {r} took it, so the ranks' shards no longer belong "
                    "to the same model, silently. Agree on the overflow across ranks (all-reduce a "
                    "found-inf flag, MAX or SUM) so that every rank skips the step.")
        ref_step = before - want["values"][s][r]
        if stepped and not bad and bool(ref_step.any()):
            ratio = float(((before - got_v) * ref_step).sum() / (ref_step * ref_step).sum())
            if abs(ratio - prev_scale) < 1e-3 * prev_scale:
                return (f"{head} the update is {prev_scale:g} = the loss scale times too large: the "
                        "gradients were not unscaled (divided by the scale) before optimizer.step().")
    if got_s != want_s:
        if bad and got_s != prev_scale * BACKOFF and want_s == prev_scale * BACKOFF:
            return (f"{head} the scale is {got_s:g} after an overflow, expected {want_s:g}: on an "
                    f"overflow found on any rank, multiply the scale by backoff_factor.")
        if want_s == prev_scale * GROWTH and got_s == prev_scale:
            return (f"{head} the scale stayed {got_s:g}, expected {want_s:g}: after growth_interval "
                    f"= {case.growth_interval} steps in a row without an overflow, multiply the scale "
                    "by growth_factor (then count again from 0).")
        if got_s == prev_scale * GROWTH and want_s == prev_scale:
            return (f"{head} the scale grew to {got_s:g} too early, expected {want_s:g}: grow only "
                    f"after growth_interval = {case.growth_interval} steps in a row without an "
                    "overflow; an overflow starts the count again from 0.")
        return f"{head} get_scale() is {got_s!r}, expected {want_s:g}."
    return (f"{head} this rank's parameters after the step differ from one process's with "
            f"torch.amp.GradScaler: got {plain(got_v, tensors='list')}, expected "
            f"{want['values'][s][r].tolist()}.")


def _skipped_an_inf(case: ScalerCase, results: list, want: dict) -> bool:
    """Whether some rank whose gradient held an inf skipped that step, as it should."""
    for s in range(case.steps):
        for q, k in case.bad_at(s):
            before = want["values"][s - 1][q] if s else case.start(q)
            got = results[q]["values"][s]
            if k == "inf" and isinstance(got, torch.Tensor) and _close(got, before):
                return True
    return False


# ---------------------------------------------------------------- the rule
def one_flag_per_step(records, case, n) -> str | None:
    for r, rec in enumerate(records):
        for s, piece in enumerate(read.steps(rec)):
            if problem := one_small_collective(rec, piece["calls"], r, n, f" in step {s}", "a flag"):
                return problem
    return None


RULES = (Rule("Agree on the overflow with a single collective per step, on a flag of at most one "
              "element per rank: never send the gradients themselves.", one_flag_per_step),)

VISIBLE = ((3, (ScalerCase(steps=7, growth_interval=2, overflows=((1, 1, "inf"), (4, 2, "inf"))),)),)
HIDDEN = ((2, (ScalerCase(steps=8, growth_interval=3, overflows=((2, 1, "nan"), (3, 0, "inf"), (3, 1, "inf")),
                          seed=9),
               ScalerCase(steps=6, growth_interval=1, overflows=((0, 0, "nan"), (4, 1, "inf")),
                          init_scale=2.0 ** 14, seed=10))),)

ON_HANG = ("one rank called a collective that the others did not: call the all-reduce of the "
           "overflow flag in every step on every rank, whatever this rank found.")
