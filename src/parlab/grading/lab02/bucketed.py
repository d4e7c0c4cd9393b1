"""Exercise 4, ``BucketedDP(model, bucket_bytes)``: gradients all-reduced in buckets, from hooks,
during backward; ``finish()`` waits and averages.

``bucket_plan`` is the exercise's bucket rule itself (the notebook and
benchmarks/dp_step.py use it).  The rules read the spy's record of each
all-reduce: whether it was async, started during backward, waited on, and
waited on inside the hook.  The visible cases hold the traps: a frozen
parameter, a parameter exactly at the ``bucket_bytes`` boundary, one that
forward never uses (its bucket never completes by itself).
"""
from __future__ import annotations

import functools

import torch.nn as nn

from ...models import lm_loss
from ..harness import Exercise, Rule
from ..records import calls, describe
from .case import FROZEN, SPARE, TIMEOUT, UNTIED, Case
from .training import NOT_BACK, grade_trained, local_batch, ranks_differ, setup, step_result, sum_or_twice

#: The untied lm_head.weight (vocab 256 x d_model 32) in bytes: the first bucket in reverse order.
LM_HEAD_BYTES = 256 * 32 * 4

VISIBLE = ((2, (Case(frozen=FROZEN, bucket_bytes=1 << 30),
                Case(frozen=FROZEN, bucket_bytes=16_384), Case(bucket_bytes=1),
                Case(frozen=FROZEN, bucket_bytes=256),  # ln_f.bias + ln_f.weight: 256 B exactly
                Case(unused=True, bucket_bytes=4096))),)
HIDDEN = ((3, (Case(batch=6, overrides=UNTIED, bucket_bytes=LM_HEAD_BYTES),
               Case(batch=6, overrides=UNTIED, bucket_bytes=50_000, unused=True),
               Case(batch=6, unused=True, frozen=FROZEN, bucket_bytes=1 << 30))),)


def plural(count: int, word: str) -> str:
    return f"{count} {word}" + ("" if count == 1 else "s")


def bucket_plan(model: nn.Module, bucket_bytes: int) -> list[list[str]]:
    """The buckets of Exercise 4's rule, as lists of parameter names.

    The parameters that require a gradient, each Parameter once
    (``model.parameters()`` order), REVERSED; a bucket closes as soon as its
    gradients total ``bucket_bytes`` or more, so a parameter larger than
    ``bucket_bytes`` gets a bucket of its own, and the last may be smaller.
    """
    names = {id(p): n for n, p in model.named_parameters()}
    buckets, current, size = [], [], 0
    for p in reversed([p for p in model.parameters() if p.requires_grad]):
        current.append(names[id(p)])
        size += p.numel() * p.element_size()
        if size >= bucket_bytes:
            buckets.append(current)
            current, size = [], 0
    if current:
        buckets.append(current)
    return buckets


@functools.lru_cache(maxsize=64)
def case_buckets(case: Case) -> tuple[list[list[str]], int]:
    """Exercise 4's buckets for the case, and how many of them hold a parameter without gradient."""
    plan = bucket_plan(case.build(0), case.bucket_bytes)
    return plan, sum(SPARE in b for b in plan) if case.unused else 0


def run(cls, case, i, spy):
    model, opt = setup(case, 0)
    out = []
    with spy.watch():
        dp = cls(model, case.bucket_bytes)
        for step in range(case.steps):
            x, y = local_batch(case, step)
            opt.zero_grad(set_to_none=True)
            before = len(spy.calls)
            lm_loss(model, x, y).backward()
            dp.finish()
            out.append({**step_result(model, opt), "calls": len(spy.calls) - before})
    return out


# ---------------------------------------------------------------- the rules
def one_per_bucket(records, case, n):
    plan, _ = case_buckets(case)
    want = case.steps * len(plan)
    for r, rec in enumerate(records):
        got, other = len(calls(rec, "all_reduce")), [c for c in rec["calls"] if c["op"] != "all_reduce"]
        if other:
            return f"rank {r} called {describe(rec, other[0])}; only one all_reduce per bucket is asked for."
        if got != want:
            sizes = [sum(dict(case.build(0).named_parameters())[p].numel() * 4 for p in b) for b in plan]
            return (f"rank {r} made {got} all_reduce calls in {case.steps} steps, expected {want} "
                    f"(one per bucket: bucket_bytes={case.bucket_bytes} gives {plural(len(plan), 'bucket')} of "
                    f"{sizes[:8]}{' ...' if len(sizes) > 8 else ''} bytes). Hint: trainable "
                    "parameters in reverse order; close a bucket as soon as it holds >= "
                    "bucket_bytes; frozen parameters belong to no bucket.")
    return None


def all_async(records, case, n):
    for r, rec in enumerate(records):
        if any(not c["async"] for c in calls(rec, "all_reduce")):
            return (f"rank {r} called all_reduce without async_op=True, so backward stops until "
                    "each bucket is sent. Launch it with async_op=True and keep the work object.")
    return None


def launched_in_backward(records, case, n):
    _, incomplete = case_buckets(case)
    for r, rec in enumerate(records):
        started, late = calls(rec, "all_reduce"), len(calls(rec, "all_reduce", backward=False))
        if late > case.steps * incomplete:
            return (f"rank {r} launched {late} of {len(started)} bucket all-reduces after backward "
                    "returned (in finish()?). Launch each bucket from the gradient hook as soon as "
                    "its last gradient arrives, so the communication overlaps the rest of backward.")
    return None


def no_wait_in_hook(records, case, n):
    for r, rec in enumerate(records):
        early = sum(c["waited_in_backward"] for c in calls(rec, "all_reduce"))
        if early:
            return (f"rank {r} waited for {early} bucket all-reduces during backward (inside the "
                    "hook), so nothing overlapped: keep the work objects and wait in finish().")
    return None


def never_waited(records) -> str | None:
    for r, rec in enumerate(records):
        started = calls(rec, "all_reduce")
        if missed := sum(c["async"] and not c["waited"] for c in started):
            return (f"on rank {r}, {missed} of {len(started)} async all-reduces were never waited on: "
                    "finish() must call work.wait() on every bucket before the optimizer uses the "
                    "gradients, or it may read half-reduced values.")
    return None


def all_waited(records, case, n):
    return never_waited(records)


RULES = (Rule("Start exactly one `dist.all_reduce` per bucket per step, and no other collective.",
              one_per_bucket),
         Rule("Start every all-reduce with `async_op=True`.", all_async),
         Rule("Start a bucket's all-reduce from the hook, during backward, as soon as its last "
              "gradient has arrived; only a bucket that never completed is started in `finish()`.",
              launched_in_backward),
         Rule("Do not wait inside the hook: `finish()` waits, after backward.", no_wait_in_hook),
         Rule("`finish()` waits for every all-reduce it started (`work.wait()`) before the "
              "optimizer step.", all_waited))


# ---------------------------------------------------------------- the hints
def hint(g, i, case, s, r) -> str:
    waited = never_waited([g.records[q][i] for q in range(g.n)])
    if waited:
        return waited
    plan, incomplete = case_buckets(case)
    launched = g.at(i)[r][s]["calls"]
    if s and launched < len(plan) and g.at(i)[r][0]["calls"] == len(plan):
        return (f"step 1 launched {plural(len(plan), 'all-reduce')} but step {s + 1} only {launched}: reset your "
                "bucket state at the end of finish() (call self._new_step()).")
    if incomplete and launched < len(plan):
        return (f"a bucket holding '{SPARE}', which got no gradient, never completed, so it was never "
                "all-reduced: finish() must launch every bucket not launched yet, counting a "
                "missing gradient as zeros.")
    if ranks_differ(g, i, s):
        return ("the ranks used different gradients: some were never all-reduced, "
                + NOT_BACK.format(what="bucket", when=" after work.wait()"))
    return ""


def error_hint(text: str) -> str:
    if "NoneType" in text and "grad" in text:
        return ("p.grad is None for a parameter that got no gradient: a frozen one belongs to no "
                "bucket (register no hook on it); one that forward never used counts as zeros in "
                "its bucket, and finish() gives it the averaged slice.")
    return ""


BUCKETED = Exercise(
    key="lab02.bucketed", answer="BucketedDP", run=run, grade=grade_trained(0, sum_or_twice, hint),
    visible=VISIBLE, hidden=HIDDEN, timeout=TIMEOUT, kind="class", rules=RULES,
    on_hang="every rank must launch the same buckets in the same order, and finish() must wait for "
            "every bucket it launched (including a last, partly filled one).",
    on_error=error_hint)
