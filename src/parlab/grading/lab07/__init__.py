"""Checks for Lab 07: context parallelism (ring attention) and expert parallelism (all-to-all).

    lab07.check_ring_attention(ring_attention)   # Exercise 1: ring attention, forward and backward
    lab07.check_zigzag(zigzag_positions)         # Exercise 2: the load-balanced split
    lab07.check_expert_parallel(ExpertParallelMoE)  # Exercise 3: an MoE layer's experts over ranks

``ring`` holds exercise 1's cases, reference (``scaled_dot_product_attention``
on the whole sequence), grader and rules; ``balance`` exercise 2's;
``experts`` exercise 3's (reference: ``parlab.models.moe.MoE`` in one
process); ``recorder`` the compute, send and all-to-all events the rules read.
"""
from __future__ import annotations

from ..harness import Exercise, checker
from . import balance, experts, ring

__all__ = ["check_ring_attention", "check_zigzag", "check_expert_parallel", "EXERCISES"]

TIMEOUT = 40.0

RING = Exercise(key="lab07.ring", answer="ring_attention", run=ring.run, grade=ring.grade,
                visible=ring.VISIBLE, hidden=ring.HIDDEN, rules=ring.RULES, timeout=TIMEOUT,
                settle=ring.settle, on_hang=ring.ON_HANG)
ZIGZAG = Exercise(key="lab07.zigzag", answer="zigzag_positions", run=balance.run, grade=balance.grade,
                  visible=balance.VISIBLE, hidden=balance.HIDDEN, solo=True)
EXPERTS = Exercise(key="lab07.experts", answer="ExpertParallelMoE", run=experts.run, grade=experts.grade,
                   visible=experts.VISIBLE, hidden=experts.HIDDEN, rules=experts.RULES, timeout=TIMEOUT,
                   settle=experts.settle, kind="class", on_hang=experts.ON_HANG,
                   on_error=lambda text: experts.ON_HANG if "Timed out" in text else "",
                   on_mismatch="a receive buffer was sized for a different number of tokens than arrived: "
                               "size it from the exchanged counts (uneven splits are the rule, not equal ones).")

EXERCISES = {"ring": RING, "zigzag": ZIGZAG, "experts": EXPERTS}

check_ring_attention = checker(RING, """Exercise 1: ``fn(q, k, v, positions, causal)`` is this rank's
chunk of attention over the whole sequence, K/V passed around a ring.""")
check_zigzag = checker(ZIGZAG, """Exercise 2: ``fn(s, c)`` is the (c, s/c) zig-zag layout of positions.""")
check_expert_parallel = checker(EXPERTS, """Exercise 3: ``cls(moe, group=None)`` holds the router and this
rank's experts and dispatches tokens with all-to-all.""")
