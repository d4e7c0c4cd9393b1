"""Exercise 3, ``accumulate_and_sync(model, micro_batches, sync)``: the mean gradient over
micro-batches, then one ``sync``.

The runner hands the answer the course's ``sync`` (an all-reduce average that the
spy does not count as the answer's) and notes each call of it, so the rules can
place it among the backward passes.
"""
from __future__ import annotations

import torch.distributed as dist
import torch.nn as nn

from ...data import microbatches
from ..harness import Exercise, Rule
from ..records import describe, events, steps
from .case import FROZEN, TIMEOUT, UNTIED, Case
from .training import grade_trained, local_batch, none_grad_hint, ranks_differ, setup, step_result

VISIBLE = ((2, (Case(batch=12, micro=3), Case(batch=8, micro=4, frozen=FROZEN))),)
HIDDEN = ((3, (Case(batch=12, micro=2), Case(batch=6, micro=1),
               Case(batch=12, micro=4, overrides=UNTIED, frozen=FROZEN))),)


def run(fn, case, i, spy):
    model, opt = setup(case, 0)

    def sync(m: nn.Module) -> None:
        """The course's sync: average every gradient over the ranks."""
        spy.note("sync")
        with spy.paused():
            for p in m.parameters():
                if p.grad is not None:
                    dist.all_reduce(p.grad)
                    p.grad /= dist.get_world_size()

    out = []
    with spy.watch():
        for step in range(case.steps):
            x, y = local_batch(case, step)  # (B/n, s): split below into (B/n/k, s) micro-batches
            opt.zero_grad(set_to_none=True)
            fn(model, microbatches((x, y), case.micro), sync)
            spy.note("step")
            out.append(step_result(model, opt))
    return out


# ---------------------------------------------------------------- the rules
def one_backward_each(records, case, n):
    want = case.steps * case.micro
    for r, rec in enumerate(records):
        if rec["backward"] != want:
            return (f"rank {r} ran {rec['backward']} backward passes in {case.steps} steps of "
                    f"{case.micro} micro-batches; one per micro-batch is {want} (one backward "
                    "over the summed losses does not count).")
    return None


def sync_once_at_end(records, case, n):
    for r, rec in enumerate(records):
        for s, step in enumerate(steps(rec)):  # each closed by its "step" event
            syncs = events(step, "sync")
            if not syncs:
                return f"rank {r} never called sync(model) in step {s + 1}."
            if len(syncs) > 1:
                return (f"rank {r} called sync(model) {len(syncs)} times in step {s + 1} with "
                        f"{case.micro} micro-batches: sync only on the last micro-step; syncing "
                        f"on every micro-step sends the gradients {len(syncs)} times for nothing.")
            if syncs[0]["backward"] != step["events"][-1]["backward"]:
                return (f"rank {r} called sync(model) in step {s + 1} before the last backward, "
                        "so that micro-batch's gradient was never all-reduced.")
    return None


def no_own_collectives(records, case, n):
    for r, rec in enumerate(records):
        if own := rec["calls"]:
            return (f"rank {r} called {describe(rec, own[0])} itself "
                    f"({len(own)} calls): sync(model) does the averaging.")
    return None


RULES = (Rule("Call `backward()` once per micro-batch (one backward over the summed losses is "
              "not the exercise).", one_backward_each),
         Rule("Call `sync(model)` exactly once per step, after the last micro-batch's backward.",
              sync_once_at_end),
         Rule("Do not call any collective yourself: `sync` does the averaging.", no_own_collectives))


# ---------------------------------------------------------------- the hints
def scales(case, n) -> list:
    if case.micro == 1:
        return []
    return [(case.micro, f"divide each micro-batch loss by the number of micro-batches ({case.micro}) "
                         "before backward."),
            (1 / case.micro, f"you divided by the number of micro-batches ({case.micro}) twice.")]


def hint(g, i, case, s, r) -> str:
    done = steps(g.records[r][i])
    syncs = events(done[s], "sync") if s < len(done) else []
    if not syncs:
        return ("sync(model) was never called: the ranks' gradients were never averaged. Call it "
                "once, after the LAST micro-batch's backward.")
    if syncs[-1]["backward"] != done[s]["events"][-1]["backward"]:
        return ("sync(model) ran before the last micro-batch's backward, so that gradient was "
                "never all-reduced: call it after the loop.")
    return "the ranks used different gradients: some were never all-reduced." if ranks_differ(g, i, s) else ""


ACCUM = Exercise(key="lab02.accum", answer="accumulate_and_sync", run=run,
                 grade=grade_trained(0, scales, hint), visible=VISIBLE, hidden=HIDDEN,
                 timeout=TIMEOUT, rules=RULES,
                 on_hang="every rank must call sync(model) the same number of times.",
                 on_error=none_grad_hint)
