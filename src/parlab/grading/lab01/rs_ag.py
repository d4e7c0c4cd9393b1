"""Lab 01, exercise 1: an all-reduce built from ``dist.reduce_scatter`` + ``dist.all_gather``.

``fn(x)`` returns the sum of ``x`` over all ranks, on every rank.  Run and graded
as the other collectives (``collectives``); its own rules: no built-in
all-reduce, and both collectives called.
"""
from __future__ import annotations

from ..harness import Exercise, Rule
from ..records import used
from . import collectives as c


def must_call(*needed: str):
    def broken(records, case, n):
        for r, rec in enumerate(records):
            if missing := [op for op in needed if not used(rec, op, op + "_tensor", op + "_single",
                                                            op + "_into_tensor")]:
                return f"rank {r} never called dist.{missing[0]}."
        return None
    return broken


RS_AG = Exercise(
    key="lab01.rs_ag", answer="all_reduce_rs_ag", run=c.run, grade=c.grade,
    visible=c.ALL_REDUCE_VISIBLE, hidden=c.ALL_REDUCE_HIDDEN, settle=c.settle,
    rules=(Rule("Use `dist.reduce_scatter` and `dist.all_gather` (or their `_tensor` forms), "
                "not `dist.all_reduce`.", c.no_builtin("all_reduce")),
           Rule("Call both collectives: a reduce-scatter, then an all-gather.",
                must_call("reduce_scatter", "all_gather")),
           Rule(c.NEW_TENSOR, c.input_unchanged)),
    on_hang="every rank must call reduce_scatter and all_gather the same number of times, with "
            "the same sizes.",
    on_mismatch=c.SIZE_HINT)
