"""Lab 03, exercise 2: the column-parallel and the row-parallel linear layers.

``ColumnParallelLinear(linear, gather_output=False, group=None)`` keeps rows
of the weight (out_features/n of them) and its output is this rank's
columns, all of them with ``gather_output``; ``RowParallelLinear(linear,
group=None)`` keeps columns (in_features/n), takes this rank's slice of
the input features and returns the full output.  Both run on ``layers``'
runner and grader; the rules here read which collectives ran in forward and
in backward, and an error from a weight shard that does not fit its input
says which sizes differ and by what factor, and how nn.Linear's weight is split.
"""
from __future__ import annotations

import math
import re

from ..harness import Rule
from ..records import calls
from .cases import Case, team
from .layers import GATHERS, SHARDS_ONLY, exercise, grade_with_uneven, one_each, uneven_rule

# The last visible case runs on two groups of 2 ranks: gather_output's backward must slice at the
# rank's place in its group (dist.get_rank(group)), not at its global rank.
VISIBLE_COLUMN = ((4, (Case("column", (2, 3, 6), 12), Case("column", (5, 10), 8, gather=True),
                       Case("column", (3, 7), 4, bias=False), Case("column", (2, 6), 10),
                       Case("column", (3, 5), 6, gather=True, groups="pairs", seed=6))),)
HIDDEN_COLUMN = ((2, (Case("column", (4, 9), 6, seed=3), Case("column", (1, 2, 5), 14, gather=True, seed=4),
                      Case("column", (3, 4), 7, seed=5))),)
VISIBLE_ROW = ((4, (Case("row", (2, 3, 5), 12), Case("row", (4, 6), 8, bias=False),
                    Case("row", (2, 7), 10))),)
HIDDEN_ROW = ((2, (Case("row", (3, 2, 4), 6, seed=3), Case("row", (5, 3), 14, seed=4),
                   Case("row", (2, 3), 9, seed=5))),)


def _column_comm(records, case, n):
    n = len(team(case, n, 0))  # the group's ranks
    if not case.divisible(n):
        return None
    shape = case.shape[:-1] + (case.features // n,)  # (..., out/n): this rank's columns of the output
    ok = {math.prod(shape), math.prod(shape) * n}
    for r, rec in enumerate(records):
        fwd = calls(rec, backward=False)
        if not case.gather and fwd:
            return f"rank {r} called dist.{fwd[0]['op']} in forward, with gather_output=False."
        for c in fwd:
            if c["op"] not in GATHERS or c["numel"] not in ok:
                return (f"rank {r} called dist.{c['op']} on {c['numel']} elements in forward; the "
                        f"only gather is the output's ({math.prod(shape)} elements per rank).")
        bwd = calls(rec, backward=True)
        if [c["op"] for c in bwd] != ["all_reduce"]:
            return (f"rank {r} made {[c['op'] for c in bwd]} in backward; exactly one all-reduce, "
                    "of the input's gradient.")
    return None


_SPLITS = ("nn.Linear's weight is (out_features, in_features): a column-parallel layer keeps rows (dim 0), "
           "out_features/t of them, and takes the whole input; a row-parallel layer keeps columns (dim 1), "
           "in_features/t of them, to match this rank's slice of the input features.")


def _on_error(split: str):
    """The hint of a layer splitting ``split`` ("out_features" or "in_features") for an error text."""
    dim = 0 if split == "out_features" else 1

    def hint(text: str) -> str:
        refused = re.findall(r"ValueError: (.*)", text)
        if refused and "divisible" in refused[-1]:
            # the runner catches a ValueError on an uneven case: this one came on a case that divides
            return (f"your layer refused a case whose {split} divides evenly by the number of ranks (the "
                    f"first line names the case), with \"{refused[-1][:120]}\": check that the size you "
                    f"test is the one this layer splits, {split} (dim {dim} of the weight).")
        return _shape_error(text)
    return hint


def _shape_error(text: str) -> str:
    """What a shape error shows: which tensors' sizes differ, by what factor (never a guess at why)."""
    if "invalid gradient" in text and re.search(r"got \[[\d, ]*\b0\]", text):
        return ("a backward returned an empty slice of the gradient. On a group smaller than the world "
                "(the cases with groups of 2 ranks), a rank's slice of the group's tensor starts at its "
                "place in the group, dist.get_rank(group), not at its global rank.")
    # F.linear's error: mat1 is the input (rows x its features), mat2 the weight transposed (in x out)
    found = re.findall(r"shapes cannot be multiplied \((\d+)x(\d+) and (\d+)x(\d+)\)", text)
    if found:
        _, given, takes, _ = map(int, found[-1])
        if given and takes and max(given, takes) % min(given, takes) == 0:
            k = max(given, takes) // min(given, takes)
            more = "weight takes" if takes > given else "input holds"
            return (f"the input reaching F.linear holds {given} features and the weight takes {takes}: the "
                    f"{more} {k} times as many as the other, a split of one of them that the other did "
                    "not get. " + _SPLITS)
        return f"the input reaching F.linear holds {given} features and the weight takes {takes}. " + _SPLITS
    if "cannot be multiplied" in text or "size of tensor" in text:
        return "a tensor's size does not fit the one it is combined with (the error above names both). " + _SPLITS
    return ""


COLUMN = exercise("column", "ColumnParallelLinear", grade_with_uneven("out_features"),
                  VISIBLE_COLUMN, HIDDEN_COLUMN,
                  (SHARDS_ONLY,
                   Rule("No all-gather of the full weight: forward communicates only to gather the output "
                        "(with `gather_output=True`), and backward makes one all-reduce.", _column_comm),
                   uneven_rule("out_features")),
                  on_error=_on_error("out_features"))
ROW = exercise("row", "RowParallelLinear", grade_with_uneven("in_features"), VISIBLE_ROW, HIDDEN_ROW,
               (SHARDS_ONLY,
                Rule("Forward makes exactly one all-reduce (of the output); backward makes none.",
                     one_each(["all_reduce"], [], "one all-reduce in forward, none in backward")),
                uneven_rule("in_features")),
               on_error=_on_error("in_features"))
