"""Lab 01, exercise 1: an all-reduce built from ``dist.reduce_scatter`` + ``dist.all_gather``.

``fn(x)`` returns the sum of ``x`` over all ranks, on every rank.  Run and graded
as the other collectives (``collectives``); its own rules: no built-in
all-reduce, and both collectives called.
"""
from __future__ import annotations

from ..harness import Exercise, Rule
from ..records import describe, used
from . import collectives as c


def _forms(op: str) -> tuple[str, ...]:
    return (op, op + "_tensor", op + "_single", op + "_into_tensor")


def must_call(*needed: str):
    def broken(records, case, n):
        for r, rec in enumerate(records):
            if missing := [op for op in needed if not used(rec, *_forms(op))]:
                return f"rank {r} never called dist.{missing[0]}."
        return None
    return broken


def reduce_scatter_then_all_gather(records, case, n):
    """Both collectives, the reduce-scatter first, and the all-gather carrying reduced chunks
    (at most ceil(numel / n) elements from each rank), so that the result is theirs."""
    if missing := must_call("reduce_scatter", "all_gather")(records, case, n):
        return missing
    chunk = -(-case.numel // n)
    for r, rec in enumerate(records):
        order = rec["calls"]
        first = next(k for k, c in enumerate(order) if c["op"] in _forms("reduce_scatter"))
        early = [c for c in order[:first] if c["op"] in _forms("all_gather")]
        if early:
            return (f"rank {r} called {describe(rec, early[0])} before its first reduce-scatter "
                    f"({describe(rec, order[first])}): gather the chunks the reduce-scatter reduced.")
        # all_gather records one piece of its list; the tensor forms record the whole output
        big = [c for c in order if c["op"] in _forms("all_gather")
               and c["numel"] > (chunk if c["op"] == "all_gather" else chunk * n)]
        if big and case.numel > chunk:
            return (f"rank {r} called {describe(rec, big[0])}: more than one reduced chunk from each "
                    f"rank (ceil({case.numel} / {n}) = {chunk} elements). The all-gather carries the "
                    "chunk the reduce-scatter left on each rank, not the input.")
    return None


RS_AG = Exercise(
    key="lab01.rs_ag", answer="all_reduce_rs_ag", run=c.run, grade=c.grade,
    visible=c.ALL_REDUCE_VISIBLE, hidden=c.ALL_REDUCE_HIDDEN, settle=c.settle,
    rules=(Rule("Use `dist.reduce_scatter` and `dist.all_gather` (or their `_tensor` forms), "
                "not `dist.all_reduce`.", c.no_builtin("all_reduce")),
           Rule("Call both collectives: a reduce-scatter, then an all-gather.",
                reduce_scatter_then_all_gather),
           Rule(c.NEW_TENSOR, c.input_unchanged)),
    on_hang="every rank must call reduce_scatter and all_gather the same number of times, with "
            "the same sizes.",
    on_mismatch=c.SIZE_HINT)
