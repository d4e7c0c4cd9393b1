"""Lab 03, exercises 3 and 4: the tensor-parallel MLP and attention.

``ParallelMLP(mlp, group=None)`` is parlab's MLP, column- then row-parallel;
``ParallelAttention(attn, group=None)`` is parlab's attention with the
heads split across ranks (n_head/n per rank).  Both make one all-reduce in
forward (g, after the row-parallel projection) and one in backward (f, before
the column-parallel ones), and run on ``layers``' runner and grader.
"""
from __future__ import annotations

from ..harness import Rule
from .cases import Case
from .layers import SHARDS_ONLY, exercise, grade, grade_with_uneven, one_each, uneven_rule

VISIBLE_MLP = ((4, (Case("mlp", (2, 5, 6)), Case("mlp", (3, 2, 10), bias=False, seed=1))),)
HIDDEN_MLP = ((3, (Case("mlp", (2, 4, 9), seed=2), Case("mlp", (1, 7, 6), seed=3))),)
VISIBLE_ATTENTION = ((4, (Case("attn", (2, 5, 16), 4), Case("attn", (1, 7, 24), 8, bias=False, seed=1),
                          Case("attn", (2, 3, 12), 6))),)
HIDDEN_ATTENTION = ((3, (Case("attn", (2, 6, 12), 3, seed=2), Case("attn", (1, 5, 30), 6, seed=3),
                         Case("attn", (2, 3, 8), 4, seed=4))),)

_ONE_ALL_REDUCE_EACH = Rule("One all-reduce in forward and one in backward, and no other collective (no "
                            "all-gather of the full weight).",
                            one_each(["all_reduce"], ["all_reduce"], "one all-reduce in each"))

MLP = exercise("mlp", "ParallelMLP", grade, VISIBLE_MLP, HIDDEN_MLP, (SHARDS_ONLY, _ONE_ALL_REDUCE_EACH))
ATTENTION = exercise("attn", "ParallelAttention", grade_with_uneven("n_head"), VISIBLE_ATTENTION,
                     HIDDEN_ATTENTION, (SHARDS_ONLY, _ONE_ALL_REDUCE_EACH, uneven_rule("n_head")))
