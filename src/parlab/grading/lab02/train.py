"""Exercise 6, ``train_data_parallel(model, optimizer, steps, batch_size, seq_len, seed)``: data-parallel
training with the lab's own functions, on Hugging Face models (Llama, GPT-2).

Every rank builds its model from its own seed (``INIT_SEED + rank``).  The runner
hooks the model's forward pass (the rows each training forward sees) and the
optimizer's step (the gradients before it, the parameters after it), so the
answer may run its own loop.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from ..harness import Exercise, Rule
from ..records import events, steps
from .case import DATA_SEED, INIT_SEED, TIMEOUT, Case
from .training import (SAME_COLLECTIVES, grade_trained, hint_replicated, none_grad_hint, packed_grads,
                       packed_params, setup, sum_or_twice)

VISIBLE = ((2, (Case(model="llama", overrides=(), batch=8),)),)
HIDDEN = ((3, (Case(model="llama", overrides=(), batch=6),
               Case(model="gpt2", overrides=(), batch=6, steps=2))),)


def run(fn, case, i, spy):
    model, opt = setup(case, INIT_SEED + dist.get_rank())
    out: list = []

    def seen(module, args, kwargs):  # the rows each training forward pass of this rank receives
        idx = args[0] if args else kwargs.get("input_ids", kwargs.get("idx"))  # (B/n, s) if right
        if torch.is_grad_enabled():  # a forward under no_grad (logging a loss) trains nothing
            spy.note("forward", rows=int(idx.size(0)) if isinstance(idx, torch.Tensor) else 0)

    def before_step(*_):
        spy.note("step")
        out.append({"grads": packed_grads(model)})

    model.register_forward_pre_hook(seen, with_kwargs=True)
    opt.register_step_pre_hook(before_step)
    opt.register_step_post_hook(lambda *_: out[-1].update(params=packed_params(model)))
    with spy.watch():
        fn(model, opt, case.steps, case.batch, case.seq, DATA_SEED)
    return out


def uses_ddp(records, case, n):
    if any(rec["ddp"] for rec in records):
        return "it wrapped the model in torch's DistributedDataParallel."
    return None


def own_rows(records, case, n):
    share = case.batch // n
    for r, rec in enumerate(records):
        for s, step in enumerate(steps(rec)):
            rows = sum(e.get("rows", 0) for e in events(step, "forward"))
            if rows != share:
                return (f"in step {s + 1}, rank {r}'s forward passes saw {rows} rows of the global "
                        f"batch of {case.batch}; its share is {share} rows.")
    return None


RULES = (Rule("Use your own functions from this lab: do not wrap the model in torch's "
              "`DistributedDataParallel`.", uses_ddp),
         Rule("Each step, run forward and backward on this rank's block of the global batch only.",
              own_rows))

TRAIN = Exercise(key="lab02.train", answer="train_data_parallel", run=run,
                 grade=grade_trained(INIT_SEED, sum_or_twice, hint_replicated), visible=VISIBLE,
                 hidden=HIDDEN, timeout=TIMEOUT, rules=RULES, on_hang=SAME_COLLECTIVES,
                 on_error=none_grad_hint)
