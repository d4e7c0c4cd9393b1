"""Lab 01, exercise 3: a broadcast sent down a binary tree of point-to-point messages.

``fn(x, root)`` returns root's ``x`` on every rank.  Every root is tried, and a
world size that is not a power of two (hidden: 3 ranks).  Run and graded as
the other collectives (``collectives``); its own rule, judged on the spy's
calls: every rank sends at most two messages and every rank but the root
receives exactly one.
"""
from __future__ import annotations

from ..harness import Exercise, Rule
from ..records import calls
from ..spy import COLLECTIVES
from . import collectives as c
from .collectives import Case


def fan_out(records, case, n):
    for r, rec in enumerate(records):
        sends = calls(rec, "send", "isend")
        peers = sorted({call["peer"] for call in sends if call["peer"] is not None})
        if len(sends) > 2:
            return (f"rank {r} sent {len(sends)} messages (to ranks {peers}): a linear chain from "
                    "one rank, not a binary tree, where every rank sends to at most its two "
                    "children.")
        recvs = calls(rec, "recv", "irecv")
        if r != case.root and len(recvs) != 1:
            return f"rank {r} received {len(recvs)} messages; in a tree each non-root rank receives once."
    return None


VISIBLE = ((4, tuple(Case((5,), root=r) for r in range(4))
            + tuple(Case((2, 3), "int64", root=r) for r in (3, 1))),)
HIDDEN = ((3, tuple(Case((7,), "float64", root=r) for r in range(3))
           + (Case((1,), "bfloat16", root=2), Case((4, 4), "int32", root=1))),)

TREE = Exercise(
    key="lab01.tree", answer="tree_broadcast", run=c.run, grade=c.grade,
    visible=VISIBLE, hidden=HIDDEN, settle=c.settle,
    rules=(Rule(c.ONLY_P2P_SAYS.replace(": no collective.", ": no `dist.broadcast` or other "
                                                            "collective."),
                c.no_builtin(*COLLECTIVES)),
           Rule("Every rank sends to at most its two children, and every rank but the root "
                "receives exactly once.", fan_out)),
    on_hang="some rank waits for a message nobody sends: check that each child receives from "
            "exactly the parent that sends to it, for every root and world size.",
    on_mismatch=c.SIZE_HINT)
