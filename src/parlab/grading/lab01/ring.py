"""Lab 01, exercise 2: a ring all-reduce from point-to-point messages.

``fn(x)`` returns the sum of ``x`` over all ranks, built from ``send``/``recv``
(or ``isend``/``irecv``) around a ring: a reduce-scatter of n − 1 steps, then
an all-gather of n − 1 steps, each message one chunk of about numel / n
elements.  Run and graded as the other collectives (``collectives``); its own
rules are judged on the spy's calls: the peers of every message, and the size
and number of messages.  Hidden: 3 ranks as exercise 1, and 2 ranks.
"""
from __future__ import annotations

from ..harness import Exercise, Rule
from ..records import calls
from ..spy import COLLECTIVES
from . import collectives as c
from .collectives import Case


def neighbours(records, case, n):
    for r, rec in enumerate(records):
        for call in calls(rec):
            if call["op"] in ("send", "isend") and call["peer"] not in (None, (r + 1) % n):
                return (f"rank {r} sent to rank {call['peer']}; in a ring it sends only to its right "
                        f"neighbour {(r + 1) % n}.")
            if call["op"] in ("recv", "irecv") and call["peer"] not in (None, (r - 1) % n):
                return (f"rank {r} received from rank {call['peer']}; in a ring it receives only "
                        f"from its left neighbour {(r - 1) % n}.")
    return None


def chunks(records, case, n):
    chunk = -(-case.numel // n)  # ceil(numel / n): the largest of n chunks
    for r, rec in enumerate(records):
        sends = calls(rec, "send", "isend")
        big = [call["numel"] for call in sends if call["numel"] > chunk]
        if big:
            return (f"rank {r} sent a message of {big[0]} elements; each message of a ring "
                    f"all-reduce carries one chunk, at most ceil(numel / n) = {chunk} here.")
        if len(sends) > 2 * (n - 1):
            return (f"rank {r} sent {len(sends)} messages; a ring all-reduce sends "
                    f"2(n - 1) = {2 * (n - 1)}.")
    return None


HIDDEN = c.ALL_REDUCE_HIDDEN + ((2, (Case((1,)), Case((5,)), Case((13,), "float64"),
                                     Case((4, 3), "int64"))),)

RING = Exercise(
    key="lab01.ring", answer="ring_all_reduce", run=c.run, grade=c.grade,
    visible=c.ALL_REDUCE_VISIBLE, hidden=HIDDEN, settle=c.settle,
    rules=(Rule(c.ONLY_P2P_SAYS, c.no_builtin(*COLLECTIVES)),
           Rule("Rank r sends only to (r + 1) % n and receives only from (r - 1) % n.", neighbours),
           Rule("Each message carries one chunk: 2(n − 1) messages of at most ceil(numel / n) "
                "elements per rank.", chunks),
           Rule(c.NEW_TENSOR, c.input_unchanged)),
    on_hang="a ring where every rank first calls a blocking dist.send waits forever: gloo's send "
            "only completes once the neighbour posts the matching recv, and that neighbour is "
            "itself stuck in send. Post both with dist.isend/dist.irecv and wait on both, or let "
            "even ranks send first and odd ranks receive first.",
    on_mismatch=c.SIZE_HINT)
