"""Lab 02's rules and error hints: how an answer with the right numbers can still be wrong.

Each function here judges one rule that the notebook states under
"Rules (checked)" (the sentences are declared with the exercises in
``parlab.grading.lab02``).  It reads the spy's records of every rank for one
case (``parlab.grading.spy``: dist calls, backward passes, DDP constructions,
and the events the runners note) and returns what the answer did wrong, or
None.  ``bucket_plan`` is Exercise 4's bucket rule itself.
"""
from __future__ import annotations

import functools

import torch.nn as nn

from ... import check

#: The trainable parameter that ``Case(unused=True)`` adds and forward never uses.
SPARE = "spare"


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


def per_step(record: dict) -> list[list[dict]]:
    """A record's events split at each "step" event: [[events of step 1, ..., its step], ...]."""
    steps, current = [], []
    for e in record["events"]:
        current.append(e)
        if e["event"] == "step":
            steps.append(current)
            current = []
    return steps


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
        for s, events in enumerate(per_step(rec)):
            syncs = [e for e in events if e["event"] == "sync"]
            if not syncs:
                return f"rank {r} never called sync(model) in step {s + 1}."
            if len(syncs) > 1:
                return (f"rank {r} called sync(model) {len(syncs)} times in step {s + 1} with "
                        f"{case.micro} micro-batches: sync only on the last micro-step; syncing "
                        f"on every micro-step sends the gradients {len(syncs)} times for nothing.")
            if syncs[0]["backward"] != events[-1]["backward"]:
                return (f"rank {r} called sync(model) in step {s + 1} before the last backward, "
                        "so that micro-batch's gradient was never all-reduced.")
    return None


def no_own_collectives(records, case, n):
    for r, rec in enumerate(records):
        if rec["calls"]:
            return (f"rank {r} called dist.{rec['calls'][0]['op']} itself "
                    f"({len(rec['calls'])} calls): sync(model) does the averaging.")
    return None


@functools.lru_cache(maxsize=64)
def case_buckets(case) -> tuple[list[list[str]], int]:
    """Exercise 4's buckets for the case, and how many of them hold a parameter without gradient."""
    plan = bucket_plan(case.build(0), case.bucket_bytes)
    return plan, sum(SPARE in b for b in plan) if case.unused else 0


def _all_reduce_calls(rec: dict) -> list[dict]:
    return [c for c in rec["calls"] if c["op"] == "all_reduce"]


def one_per_bucket(records, case, n):
    plan, _ = case_buckets(case)
    want = case.steps * len(plan)
    for r, rec in enumerate(records):
        got, other = len(_all_reduce_calls(rec)), [c["op"] for c in rec["calls"] if c["op"] != "all_reduce"]
        if other:
            return f"rank {r} called dist.{other[0]}; only one all_reduce per bucket is asked for."
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
        if any(not c["async"] for c in _all_reduce_calls(rec)):
            return (f"rank {r} called all_reduce without async_op=True, so backward stops until "
                    "each bucket is sent. Launch it with async_op=True and keep the work object.")
    return None


def launched_in_backward(records, case, n):
    _, incomplete = case_buckets(case)
    for r, rec in enumerate(records):
        calls = _all_reduce_calls(rec)
        late = sum(not c["in_backward"] for c in calls)
        if late > case.steps * incomplete:
            return (f"rank {r} launched {late} of {len(calls)} bucket all-reduces after backward "
                    "returned (in finish()?). Launch each bucket from the gradient hook as soon as "
                    "its last gradient arrives, so the communication overlaps the rest of backward.")
    return None


def no_wait_in_hook(records, case, n):
    for r, rec in enumerate(records):
        early = sum(c["waited_in_backward"] for c in _all_reduce_calls(rec))
        if early:
            return (f"rank {r} waited for {early} bucket all-reduces during backward (inside the "
                    "hook), so nothing overlapped: keep the work objects and wait in finish().")
    return None


def never_waited(records) -> str | None:
    for r, rec in enumerate(records):
        calls = _all_reduce_calls(rec)
        if missed := sum(c["async"] and not c["waited"] for c in calls):
            return (f"on rank {r}, {missed} of {len(calls)} async all-reduces were never waited on: "
                    "finish() must call work.wait() on every bucket before the optimizer uses the "
                    "gradients, or it may read half-reduced values.")
    return None


def all_waited(records, case, n):
    return never_waited(records)


def uses_ddp(records, case, n):
    if any(rec["ddp"] for rec in records):
        return "it wrapped the model in torch's DistributedDataParallel."
    return None


def builds_ddp(records, case, n):
    if lazy := [r for r, rec in enumerate(records) if not rec["ddp"]]:
        return f"{check.ranks_phrase(lazy)} never built a torch DistributedDataParallel."
    return None


def own_rows(records, case, n):
    share = case.batch // n
    for r, rec in enumerate(records):
        for s, events in enumerate(per_step(rec)):
            rows = sum(e.get("rows", 0) for e in events if e["event"] == "forward")
            if rows != share:
                return (f"in step {s + 1}, rank {r}'s forward passes saw {rows} rows of the global "
                        f"batch of {case.batch}; its share is {share} rows.")
    return None


# ---------------------------------------------------------------- hints on errors
def none_grad_hint(text: str) -> str:
    if "NoneType" in text and "grad" in text:
        return ("a parameter without a gradient has p.grad None: a frozen one (requires_grad=False) "
                "never gets one; skip it, on every rank.")
    return ""


def bucket_error_hint(text: str) -> str:
    if "NoneType" in text and "grad" in text:
        return ("p.grad is None for a parameter that got no gradient: a frozen one belongs to no "
                "bucket (register no hook on it); one that forward never used counts as zeros in "
                "its bucket, and finish() gives it the averaged slice.")
    return ""


def ddp_error_hint(text: str) -> str:
    if "device_ids" in text:
        return ("device_ids names the GPU a module lives on; leave it out: DDP uses the device the "
                "model's parameters are already on (the CPU here, this rank's GPU under NCCL).")
    return ""


SAME_COLLECTIVES = ("every rank must make the same collectives, in the same order, with the same sizes; "
         "skip a parameter whose .grad is None (frozen) on EVERY rank.")
