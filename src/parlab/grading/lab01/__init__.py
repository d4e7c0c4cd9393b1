"""Checks for Lab 01: backends and collectives.

    lab01.check_allreduce_from_rs_ag(all_reduce_rs_ag)     # Exercise 1
    lab01.check_ring_allreduce(ring_all_reduce)            # Exercise 2
    lab01.check_tree_broadcast(tree_broadcast)             # Exercise 3
    lab01.check_bandwidths(bandwidths)                     # Exercise 4

``collectives`` holds what exercises 1-3 share: their inputs, made from a seed
per (case, rank) so that the grader rebuilds every rank's input and adds them
up itself (the reference never uses a collective), the runner, the grader
that names the likely mistake, and the rules more than one states.
``rs_ag``, ``ring`` and ``tree`` hold each one's cases, own rules (the ring's
neighbours and chunk sizes, the tree's fan-out) and hints; ``bandwidths``
exercise 4, a plain function graded in process.
"""
from __future__ import annotations

from ..harness import checker
from .bandwidths import BANDWIDTHS
from .ring import RING
from .rs_ag import RS_AG
from .tree import TREE

__all__ = ["check_allreduce_from_rs_ag", "check_ring_allreduce", "check_tree_broadcast",
           "check_bandwidths", "EXERCISES"]

EXERCISES = {"rs_ag": RS_AG, "ring": RING, "tree": TREE, "bandwidths": BANDWIDTHS}

check_allreduce_from_rs_ag = checker(RS_AG, """Exercise 1: ``fn(x)`` returns the sum of ``x`` over
all ranks, built from reduce-scatter + all-gather.""")
check_ring_allreduce = checker(RING, """Exercise 2: ``fn(x)`` returns the sum of ``x`` over all
ranks, built from point-to-point messages around a ring.""")
check_tree_broadcast = checker(TREE, """Exercise 3: ``fn(x, root)`` returns root's ``x`` on every
rank, sent down a binary tree.""")
check_bandwidths = checker(BANDWIDTHS, """Exercise 4: ``fn(numel, dtype, seconds, world_size) ->
(algbw, busbw)`` in GB/s (1e9 B/s) for an all-reduce, with the nccl-tests definitions
(NVIDIA nccl-tests, doc/PERFORMANCE.md).""")
