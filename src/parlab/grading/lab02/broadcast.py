"""Exercise 1a, ``broadcast_parameters(model)``: rank 0's parameters copied into every rank's model.

Every rank builds its model from its own seed (``INIT_SEED + rank``), so only a
broadcast makes them agree; each rank's parameters are compared with rank 0's
initial ones, and a miss is named: nothing arrived, the wrong source, an average.
"""
from __future__ import annotations

import functools

import torch.distributed as dist
import torch.nn as nn

from ... import check
from ...launch.runtime import device
from ..diagnosis import hint
from ..harness import Exercise, Graded
from .case import FROZEN, INIT_SEED, TIMEOUT, UNTIED, Case

VISIBLE = ((2, (Case(), Case(frozen=FROZEN))),)
HIDDEN = ((3, (Case(overrides=UNTIED), Case(overrides=(("n_layer", 1), ("d_model", 16))))),)


def params(model: nn.Module) -> dict:
    """Every named parameter, detached, on the CPU."""
    return {n: p.detach().cpu().clone() for n, p in model.named_parameters()}


@functools.lru_cache(maxsize=64)
def initial(case: Case, seed: int) -> dict:
    return params(case.build(seed))


def run(fn, case, i, spy):
    model = case.build(INIT_SEED + dist.get_rank()).to(device())
    with spy.watch():
        fn(model)
    return params(model)


def grade(g: Graded) -> str | None:
    for i, case in enumerate(g.cases):
        inits = [initial(case, INIT_SEED + r) for r in range(g.n)]
        for r, got in enumerate(g.at(i)):
            try:
                check.assert_params_match(got, inits[0], rank=r)
            except AssertionError as err:
                return f"{g.name} is wrong for {case.describe(g.n)}.\n{err}" + hint(_why(g, i, r, inits))
    return None


def _why(g: Graded, i: int, r: int, inits: list) -> str:
    """Whose values rank ``r`` holds, when the evidence says: its own, another rank's, the average."""
    got = g.at(i)[r]
    same = [s for s in range(g.n) if not check.named_differ(got, inits[s])]
    if 0 in same:  # rank 0's values, yet not a match: the names or shapes differ (the message says how)
        return ""
    if r in same:
        return (f"rank {r} still holds its own initial parameters: nothing reached it "
                "(every rank must call dist.broadcast(p.data, src=0) for every parameter).")
    if same:
        return (f"rank {r} holds rank {same[0]}'s initial parameters: the broadcast came "
                f"from rank {same[0]}, but the source must be rank 0 (src=0).")
    mean = {k: sum(init[k] for init in inits) / g.n for k in inits[0]}
    if all(not check.named_differ(out, mean) for out in g.at(i)):
        return ("every rank holds the average of the ranks' initial values: averaged "
                "(all_reduce) instead of copying rank 0's parameters (broadcast).")
    return ""


BROADCAST = Exercise(key="lab02.broadcast", answer="broadcast_parameters", run=run, grade=grade,
                     visible=VISIBLE, hidden=HIDDEN, timeout=TIMEOUT)
