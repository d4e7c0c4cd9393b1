"""Exercise 2, ``allreduce_gradients(model)``: after backward, the average over ranks in every ``p.grad``.

Every rank builds the same model (seed 0) and trains on its block of the batch,
calling the answer between backward and the optimizer step.
"""
from __future__ import annotations

from ...models import lm_loss
from ..harness import Exercise
from .case import FROZEN, TIMEOUT, UNTIED, Case
from .training import (NOT_BACK, SAME_COLLECTIVES, grade_trained, local_batch, none_grad_hint,
                       ranks_differ, setup, step_result, sum_or_twice)

VISIBLE = ((2, (Case(batch=8), Case(batch=4, frozen=FROZEN))),)
HIDDEN = ((3, (Case(batch=6), Case(batch=12, overrides=UNTIED,
                                    frozen=("ln_f.weight", "blocks.0.attn.q.bias")))),)


def run(fn, case, i, spy):
    model, opt = setup(case, 0)
    out = []
    for step in range(case.steps):
        x, y = local_batch(case, step)
        opt.zero_grad(set_to_none=True)
        lm_loss(model, x, y).backward()
        with spy.watch():
            fn(model)
        out.append(step_result(model, opt))
    return out


def hint(g, i, case, s, r) -> str:
    if ranks_differ(g, i, s):
        return ("the ranks used different gradients: some were never all-reduced, "
                + NOT_BACK.format(what="result", when=""))
    return ""


ALLREDUCE = Exercise(key="lab02.allreduce", answer="allreduce_gradients", run=run,
                     grade=grade_trained(0, sum_or_twice, hint), visible=VISIBLE, hidden=HIDDEN,
                     timeout=TIMEOUT, on_hang=SAME_COLLECTIVES, on_mismatch=SAME_COLLECTIVES,
                     on_error=none_grad_hint)
