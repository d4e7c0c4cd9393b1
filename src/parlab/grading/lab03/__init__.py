"""Checks for Lab 03: tensor parallelism, on the grading harness.

    lab03.check_f(CopyToParallel)                     # Exercise 1a: f
    lab03.check_g(ReduceFromParallel)                 # Exercise 1b: g
    lab03.check_column(ColumnParallelLinear)          # Exercise 2a
    lab03.check_row(RowParallelLinear)                # Exercise 2b
    lab03.check_mlp(ParallelMLP)                      # Exercise 3
    lab03.check_attention(ParallelAttention)          # Exercise 4
    lab03.check_sequence_parallel(SequenceParallelBlock)  # Exercise 5
    lab03.check_tp_bytes(tp_bytes_per_layer)          # Exercise 6 (a formula)

``fg`` holds exercise 1's f and g; ``layers`` the runner, grader and shared
rules of the parallel layers, whose exercises are in ``linear`` (2),
``mlp_attention`` (3, 4) and ``sequence`` (5); ``tp_bytes`` exercise 6.
``cases`` is the test input and the single-process reference every layer is
judged against.  The rules read the spy's record through ``grading.records``;
what leaves a rank goes through ``grading.plain``.
"""
from __future__ import annotations

from ..harness import checker
from .cases import Case, reference_module
from .fg import F, G
from .linear import COLUMN, ROW
from .mlp_attention import ATTENTION, MLP
from .sequence import SEQUENCE
from .tp_bytes import BYTES

__all__ = ["check_f", "check_g", "check_column", "check_row", "check_mlp", "check_attention",
           "check_sequence_parallel", "check_tp_bytes", "Case", "EXERCISES", "reference_module"]

EXERCISES = {"f": F, "g": G, "column": COLUMN, "row": ROW, "mlp": MLP, "attn": ATTENTION,
             "sp": SEQUENCE, "bytes": BYTES}

check_f = checker(F, """Exercise 1a: ``cls.apply(x, group)`` is the identity in forward and
all-reduces the gradient over ``group`` in backward.""")
check_g = checker(G, """Exercise 1b: ``cls.apply(x, group)`` all-reduces x over ``group`` in
forward and passes the gradient through in backward.""")
check_column = checker(COLUMN, """Exercise 2a: ``cls(linear, gather_output=False, group=None)``
keeps rows of the weight; its output is this rank's columns (all of them with gather_output).""")
check_row = checker(ROW, """Exercise 2b: ``cls(linear, group=None)`` keeps columns of the weight,
takes this rank's slice of the input features and returns the full output.""")
check_mlp = checker(MLP, """Exercise 3: ``cls(mlp, group=None)`` is parlab's MLP, column- then
row-parallel.""")
check_attention = checker(ATTENTION, """Exercise 4: ``cls(attn, group=None)`` is parlab's attention
with the heads split across ranks.""")
check_sequence_parallel = checker(SEQUENCE, """Exercise 5: ``cls(block, group=None)`` runs a
transformer block on this rank's part of the sequence.""")
check_tp_bytes = checker(BYTES, """Exercise 6: ``fn(b, s, h, t, bytes_per_element)`` is the number
of bytes each rank sends per layer per step under Megatron TP.""")
