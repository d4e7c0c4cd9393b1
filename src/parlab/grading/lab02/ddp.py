"""Exercise 5, ``make_ddp(model)``: the model wrapped in torch's ``DistributedDataParallel``.

Every rank builds its model from its own seed (``INIT_SEED + rank``): DDP's
construction must broadcast rank 0's weights.  The runner trains through the
returned module and compares with rank 0's model trained in one process.
"""
from __future__ import annotations

import torch.distributed as dist
import torch.nn as nn

from ... import check
from ...models import lm_loss
from ..harness import Exercise, Rule
from .case import FROZEN, INIT_SEED, TIMEOUT, Case
from .training import SUMMED, grade_trained, hint_replicated, local_batch, setup, step_result

VISIBLE = ((2, (Case(batch=8), Case(batch=4, frozen=FROZEN))),)
HIDDEN = ((3, (Case(batch=6),)),)


def run(fn, case, i, spy):
    model, opt = setup(case, INIT_SEED + dist.get_rank())
    with spy.watch():
        wrapped = fn(model)
    if not isinstance(wrapped, nn.Module):
        raise TypeError(f"make_ddp returned {type(wrapped).__name__}, not a module: return the "
                        "wrapped model")
    out = []
    for step in range(case.steps):
        x, y = local_batch(case, step)
        opt.zero_grad(set_to_none=True)
        lm_loss(wrapped, x, y).backward()
        out.append(step_result(model, opt))
    return out


def builds_ddp(records, case, n):
    if lazy := [r for r, rec in enumerate(records) if not rec["ddp"]]:
        return f"{check.ranks_phrase(lazy)} never built a torch DistributedDataParallel."
    return None


RULES = (Rule("Return `model` wrapped in torch's `DistributedDataParallel`.", builds_ddp),)


def error_hint(text: str) -> str:
    if "device_ids" in text:
        return ("device_ids names the GPU a module lives on; leave it out: DDP uses the device the "
                "model's parameters are already on (the CPU here, this rank's GPU under NCCL).")
    return ""


DDP = Exercise(key="lab02.ddp", answer="make_ddp", run=run,
               grade=grade_trained(INIT_SEED, lambda case, n: [(n, SUMMED)], hint_replicated),
               visible=VISIBLE, hidden=HIDDEN, timeout=TIMEOUT, rules=RULES, on_error=error_hint)
