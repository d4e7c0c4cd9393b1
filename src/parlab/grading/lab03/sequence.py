"""Lab 03, exercise 5: a transformer block with sequence parallelism.

``SequenceParallelBlock(block, group=None)`` runs parlab's transformer block
on this rank's part of the sequence, (b, s/n, h): each LayerNorm on the local
positions, an all-gather of its output to (b, s, h) before attention and
before the MLP, and a reduce-scatter back to (b, s/n, h) after each.  It runs
on ``layers``' runner (which also records every LayerNorm's input shape)
and grader; the rules here read the collectives and those shapes.
"""
from __future__ import annotations

from ..harness import Rule
from ..records import calls, describe, event, first
from .cases import Case
from .layers import GATHERS, SCATTERS, exercise, grade

VISIBLE = ((4, (Case("sp", (2, 8, 8), 4), Case("sp", (1, 12, 16), 8, seed=1),
                Case("sp", (1, 4, 12), 4, seed=4))),)
HIDDEN = ((3, (Case("sp", (2, 9, 12), 3, seed=2), Case("sp", (1, 6, 18), 6, seed=3))),)


def _sp_comm(records, case, n):
    for r, rec in enumerate(records):
        if hit := first(rec, "all_reduce"):
            return f"rank {r} called {describe(rec, hit)}."
        odd = [c for c in rec["calls"] if c["op"] not in GATHERS + SCATTERS]
        if odd:
            return f"rank {r} called {describe(rec, odd[0])}."
    return None


def _sp_counts(records, case, n):
    for r, rec in enumerate(records):
        for backward in (False, True):
            gathers = len(calls(rec, *GATHERS, backward=backward))
            scatters = len(calls(rec, *SCATTERS, backward=backward))
            if (gathers, scatters) != (2, 2):
                phase = "backward" if backward else "forward"
                return (f"rank {r} made {gathers} all-gather(s) and {scatters} reduce-scatter(s) in "
                        f"{phase}: gather the LayerNorm's output once for q, k and v together.")
    return None


def _local_norm(records, case, n):
    """Sequence parallelism: every LayerNorm input holds this rank's T/t positions."""
    local = case.shape[1] // n  # s/n: this rank's positions
    for r, rec in enumerate(records):
        seen = event(rec, "layer_norm")
        for shape in (seen or {}).get("shapes", []):
            if len(shape) == 3 and shape[1] != local:
                return (f"rank {r} ran a LayerNorm on {shape[1]} positions (input {tuple(shape)}); "
                        f"its own part of the sequence is T/t = {local}. Normalising the gathered "
                        "sequence repeats the same work on every rank and holds t times the "
                        "activations, which is what sequence parallelism removes: run ln1 and ln2 on "
                        "the local positions, then all-gather their output.")
    return None


SEQUENCE = exercise("sp", "SequenceParallelBlock", grade, VISIBLE, HIDDEN,
                    (Rule("No all-reduce: communicate only with all-gathers and reduce-scatters along the "
                          "sequence.", _sp_comm),
                     Rule("Gather once before attention and once before the MLP: two all-gathers and two "
                          "reduce-scatters in forward, and two of each in backward.", _sp_counts),
                     Rule("Run each LayerNorm on this rank's own T/t positions, before the all-gather: "
                          "not on the gathered sequence.", _local_norm)))
