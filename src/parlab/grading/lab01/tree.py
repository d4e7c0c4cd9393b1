"""Lab 01, exercise 3: a broadcast sent down a binary tree of point-to-point messages.

``fn(x, root)`` returns root's ``x`` on every rank.  Every root is tried, and a
world size that is not a power of two (hidden: 3 ranks, and 5, where a
binomial tree and the binary tree differ).  Run and graded as the other
collectives (``collectives``); its own rule, judged on the spy's calls: every
rank sends at most two messages, to its children, and every rank but the root
receives exactly one, from its parent.
"""
from __future__ import annotations

from ..harness import Exercise, Rule
from ..records import calls, describe
from ..spy import COLLECTIVES
from . import collectives as c
from .collectives import Case


def family(rank: int, root: int, n: int) -> tuple[int | None, list[int]]:
    """``rank``'s parent (None for the root) and children in the notebook's binary tree on
    virtual ranks ``v = (rank - root) % n``: parent (v − 1) // 2, children 2v + 1 and 2v + 2."""
    v = (rank - root) % n
    parent = None if v == 0 else ((v - 1) // 2 + root) % n
    return parent, [(u + root) % n for u in (2 * v + 1, 2 * v + 2) if u < n]


def fan_out(records, case, n):
    for r, rec in enumerate(records):
        sends = calls(rec, "send", "isend")
        peers = sorted({call["peer"] for call in sends if call["peer"] is not None})
        parent, children = family(r, case.root, n)
        if len(sends) > 2 and len(peers) == n - 1:
            return (f"rank {r} sent {len(sends)} messages (to ranks {peers}): a linear chain from "
                    "one rank, not a binary tree, where every rank sends to at most its two "
                    "children.")
        recvs = calls(rec, "recv", "irecv")
        stranger = next((c for c in sends if c["peer"] is not None and c["peer"] not in children), None)
        if len(sends) > 2 and not stranger:
            return (f"rank {r} sent {len(sends)} messages (to ranks {peers}); every rank sends to at "
                    "most its two children.")
        if r != case.root and len(recvs) != 1:
            return f"rank {r} received {len(recvs)} messages; in a tree each non-root rank receives once."
        if stranger:
            return (f"rank {r} called {describe(rec, stranger)}, but its children in the binary tree "
                    f"(root {case.root}) are {children or 'none'}: v = (rank − root) % n sends to "
                    "2v + 1 and 2v + 2 only (a binomial tree pairs other ranks).")
        wrong = next((c for c in recvs if c["peer"] is not None and c["peer"] != parent), None)
        if wrong:
            return (f"rank {r} called {describe(rec, wrong)}, but its parent in the binary tree "
                    f"(root {case.root}) is rank {parent}: v receives from (v − 1) // 2.")
    return None


VISIBLE = ((4, tuple(Case((5,), root=r) for r in range(4))
            + tuple(Case((2, 3), "int64", root=r) for r in (3, 1))),)
# 3 ranks: not a power of two; 5: the smallest world where a binomial tree (the root sends to
# 1, 2 and 4) and the binary tree differ.
HIDDEN = ((3, tuple(Case((7,), "float64", root=r) for r in range(3))
           + (Case((1,), "bfloat16", root=2), Case((4, 4), "int32", root=1))),
          (5, (Case((5,), root=0), Case((3,), "float64", root=4))))

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
