"""Lab 02's graders: each rank's results compared with a single-process reference.

The training exercises are compared after EVERY step with
``parlab.reference.reference_steps`` (the full batch in one process): first
the flat gradient and parameter vectors in two comparisons, and only when
they differ the named comparison of ``parlab.check`` and a hint that names
the mistake (a known scale factor, ranks that disagree, a bucket never sent).
Hints read plain results only and never raise, whatever a rank returned.
"""
from __future__ import annotations

import functools

import torch
import torch.nn as nn

from ... import check
from ...data import get_batch, shard_batch
from ..harness import Graded
from .rules import SPARE, case_buckets, never_waited, per_step, plural

#: Where ranks must start DIFFERENT (so only a broadcast makes them agree),
#: rank r builds its model from seed INIT_SEED + r and the reference is rank
#: 0's model.  Elsewhere every rank builds from seed 0.
INIT_SEED = 100
DATA_SEED = 3


def params(model: nn.Module) -> dict:
    """Every named parameter, detached, on the CPU."""
    return {n: p.detach().cpu().clone() for n, p in model.named_parameters()}


def flat(tensors) -> torch.Tensor:
    """One flat CPU tensor: a result of thousands of small tensors is slow to send back."""
    return torch.cat([t.detach().reshape(-1).float().cpu() for t in tensors])


@functools.lru_cache(maxsize=64)
def reference(case, seed: int):
    """The single-process run a case is compared with (cached: many answers share it)."""
    from ...reference import reference_steps

    return reference_steps(lambda: case.build(seed), steps=case.steps, batch_size=case.batch,
                           lr=case.lr, seed=DATA_SEED, seq_len=case.seq)


@functools.lru_cache(maxsize=64)
def initial(case, seed: int) -> dict:
    return params(case.build(seed))


def grade_broadcast(g: Graded) -> str | None:
    for i, case in enumerate(g.cases):
        inits = [initial(case, INIT_SEED + r) for r in range(g.n)]
        for r, got in enumerate(g.at(i)):
            try:
                check.assert_params_match(got, inits[0], rank=r)
            except AssertionError as err:
                same = [s for s in range(g.n) if not check.named_differ(got, inits[s])]
                if r in same and r:
                    hint = (f"rank {r} still holds its own initial parameters: nothing reached it "
                            "(every rank must call dist.broadcast(p.data, src=0) for every parameter).")
                elif same:
                    hint = (f"rank {r} holds rank {same[0]}'s initial parameters: the broadcast came "
                            f"from rank {same[0]}, but the source must be rank 0 (src=0).")
                elif all(not check.named_differ(out, g.at(i)[0]) for out in g.at(i)):
                    hint = ("all ranks agree, but not with rank 0's initial values: averaged "
                            "(all_reduce) instead of copying rank 0's parameters (broadcast)?")
                else:
                    hint = "copy rank 0's values into every parameter, in place."
                return f"{g.name} is wrong for {case.describe(g.n)}.\n{err}\nHint: {hint}"
    return None


def grade_shard(g: Graded) -> str | None:
    for i, case in enumerate(g.cases):
        x, y = get_batch(0, case.batch, case.seq, DATA_SEED)
        for r, got in enumerate(g.at(i)):
            want = shard_batch((x, y), r, g.n)
            where = f"{g.name}(x, y) for {case.describe(g.n)}, on rank {r}"
            if got is None:
                return f"{where} returned None: did you forget the `return` statement?"
            if not (isinstance(got, tuple) and len(got) == 2
                    and all(isinstance(t, torch.Tensor) for t in got)):
                what = (f"a {len(got)}-tuple" if isinstance(got, tuple) else repr(got))
                return f"{where} returned {what}; it should return a pair of tensors (x_local, y_local)."
            if got[0].shape == x.shape and g.n > 1:
                return (f"{where} returned the whole batch ({tuple(x.shape)}): every rank would "
                        f"train on all {case.batch} rows. Give rank r only its {case.batch // g.n} rows.")
            for label, t, w in zip("xy", got, want):
                if t.shape != w.shape:
                    return (f"{where} returned {label} of shape {tuple(t.shape)}, expected "
                            f"{tuple(w.shape)}: split x and y the same way, into world_size blocks.")
            if all(torch.equal(t, w) for t, w in zip(got, want)):
                continue
            blocks = [shard_batch(x, s, g.n) for s in range(g.n)]
            if torch.equal(got[0], x[r::g.n]):
                hint = ("you took every n-th row (strided, like DistributedSampler); this lab uses "
                        "contiguous blocks: rank r gets rows r*B/n .. (r+1)*B/n.")
            elif torch.equal(got[0], want[0]):
                hint = "x is right but y is not: split y exactly like x."
            elif any(torch.equal(got[0], b) for b in blocks):
                s = next(s for s, b in enumerate(blocks) if torch.equal(got[0], b))
                hint = f"that is rank {s}'s block; rank {r} gets block number {r}."
            else:
                hint = "rank r gets rows r*B/n .. (r+1)*B/n of x and of y."
            return f"{where} returned the wrong rows. Hint: {hint}"
    return None


@functools.lru_cache(maxsize=64)
def _layout(case, seed: int) -> tuple[list, list, list]:
    """(every parameter's (name, shape), the trainable ones, the reference's flat steps)."""
    model, ref = case.build(seed), reference(case, seed)
    every = [(n, p.shape) for n, p in model.named_parameters()]
    trainable = [(n, p.shape) for n, p in model.named_parameters() if p.requires_grad]
    steps = [(flat(s.grads.get(n, torch.zeros(shape)) for n, shape in trainable),
              flat(s.params[n] for n, _ in every)) for s in ref.steps]
    return every, trainable, steps


def _unflat(vector, layout, none=()) -> dict:
    """Named tensors back from a flat one (None where listed); {} if the sizes do not fit."""
    sizes = [shape.numel() for _, shape in layout]
    if not isinstance(vector, torch.Tensor) or vector.numel() != sum(sizes):
        return {}
    return {n: None if n in none else t.view(shape)
            for (n, shape), t in zip(layout, torch.split(vector, sizes))}


def _ratio(f: float) -> str:
    return f"{round(f)}x" if f >= 1 else f"1/{round(1 / f)} of"


def _compare(g: Graded, i: int, case, seed: int, ex: str) -> str | None:
    """The first step at which a rank's gradients or parameters leave the reference."""
    runs, ref = g.at(i), reference(case, seed)
    every, trainable, expected = _layout(case, seed)
    for r, steps in enumerate(runs):
        if len(steps) != len(ref.steps):
            return f"rank {r} took {len(steps)} optimizer steps, expected {len(ref.steps)}."
    for s, want in enumerate(ref.steps):
        for r in range(g.n):
            st = runs[r][s]
            if (not st["grads"]["none"] and check.same_values(st["grads"]["flat"], expected[s][0])
                    and check.same_values(st["params"], expected[s][1])):
                continue  # the common case, in two comparisons
            got, msg = _unflat(st["grads"]["flat"], trainable, st["grads"]["none"]), None
            missing = [k for k in want.grads if got.get(k) is None]
            left = [k for k in got if k not in want.grads and got[k] is None]
            scale = check.grad_scale(got, want.grads)
            named = [why for f, why in _SCALES[ex](case, g.n) if scale and abs(scale / f - 1) < 1e-3]
            if missing:
                msg = (f"rank {r}: {len(missing)} trainable parameters have no gradient (None), "
                       f"e.g. '{missing[0]}'.")
            elif left:
                msg = (f"rank {r}: '{left[0]}' got no gradient in backward, so after finish() it "
                       "must hold the average over ranks, zeros here; its p.grad is None.")
            elif named:
                return (f"rank {r}: every gradient used by step {s + 1} is {_ratio(scale)} the "
                        f"single-process full-batch reference.\nHint: {named[0]}")
            else:
                try:
                    check.assert_grads_match({k: got[k] for k in want.grads}, want.grads, rank=r,
                                             world_size=g.n)
                    check.assert_params_match(_unflat(st["params"], every), want.params, rank=r)
                except AssertionError as err:
                    msg = str(err)
            if msg:
                hint = _HINTS[ex](g, i, case, s, r)
                return (f"the gradients or parameters of step {s + 1} do not match the "
                        f"single-process full-batch reference.\n{msg}"
                        + (f"\nHint: {hint}" if hint else ""))
    return None


def grade_trained(ex: str, seed: int):
    def grade(g: Graded) -> str | None:
        for i, case in enumerate(g.cases):
            msg = _compare(g, i, case, seed, ex)
            if msg:
                return f"{g.name} is wrong for {case.describe(g.n)}: {msg}"
        return None
    return grade


_SUMMED = "summed, not averaged: after the all_reduce (a SUM) divide by the world size, or use ReduceOp.AVG."
_TWICE = "divided by the world size twice (ReduceOp.AVG already divides)."
_SCALES = {  # exercise -> (case, n) -> [(gradient / reference, what it means)]
    "allreduce": lambda case, n: [(n, _SUMMED), (1 / n, _TWICE)],
    "bucketed": lambda case, n: [(n, _SUMMED), (1 / n, _TWICE)],
    "accum": lambda case, n: [] if case.micro == 1 else [
        (case.micro, f"divide each micro-batch loss by the number of micro-batches ({case.micro}) "
                     "before backward."),
        (1 / case.micro, f"you divided by the number of micro-batches ({case.micro}) twice.")],
    "ddp": lambda case, n: [(n, _SUMMED)],
    "train": lambda case, n: [(n, _SUMMED), (1 / n, _TWICE)],
}


def _ranks_differ(g: Graded, i: int, s: int) -> bool:
    grads = [out[s]["grads"]["flat"] for out in g.at(i)]
    return any(not check.same_values(other, grads[0]) for other in grads[1:])


_NOT_BACK = ("or the reduced values never reached p.grad: torch.cat makes a copy, so copy the "
             "{what} back into each p.grad{when}.")


def _hint_allreduce(g, i, case, s, r) -> str:
    if _ranks_differ(g, i, s):
        return ("the ranks used different gradients: some were never all-reduced, "
                + _NOT_BACK.format(what="result", when=""))
    return ""


def _hint_accum(g, i, case, s, r) -> str:
    steps = per_step(g.records[r][i])
    syncs = [e for e in steps[s] if e["event"] == "sync"] if s < len(steps) else []
    if not syncs:
        return ("sync(model) was never called: the ranks' gradients were never averaged. Call it "
                "once, after the LAST micro-batch's backward.")
    if syncs[-1]["backward"] != steps[s][-1]["backward"]:
        return ("sync(model) ran before the last micro-batch's backward, so that gradient was "
                "never all-reduced: call it after the loop.")
    return "the ranks used different gradients: some were never all-reduced." if _ranks_differ(g, i, s) else ""


def _hint_bucketed(g, i, case, s, r) -> str:
    waited = never_waited([g.records[q][i] for q in range(g.n)])
    if waited:
        return waited
    plan, incomplete = case_buckets(case)
    calls = g.at(i)[r][s]["calls"]
    if s and calls < len(plan) and g.at(i)[r][0]["calls"] == len(plan):
        return (f"step 1 launched {plural(len(plan), 'all-reduce')} but step {s + 1} only {calls}: reset your "
                "bucket state at the end of finish() (call self._new_step()).")
    if incomplete and calls < len(plan):
        return (f"a bucket holding '{SPARE}', which got no gradient, never completed, so it was never "
                "all-reduced: finish() must launch every bucket not launched yet, counting a "
                "missing gradient as zeros.")
    if _ranks_differ(g, i, s):
        return ("the ranks used different gradients: some were never all-reduced, "
                + _NOT_BACK.format(what="bucket", when=" after work.wait()"))
    return ""


def _hint_replicated(g, i, case, s, r) -> str:
    if _ranks_differ(g, i, s):
        return "the ranks used different gradients: were they synchronised (all-reduced) at all?"
    if s == 0:
        return ("the ranks start from different random weights: only rank 0's initial parameters "
                "are the reference, so they must be broadcast first.")
    return ""


_HINTS = {"allreduce": _hint_allreduce, "accum": _hint_accum, "bucketed": _hint_bucketed,
          "ddp": _hint_replicated, "train": _hint_replicated}
