"""Checks for Lab 05: sharding (ZeRO-1/2/3 by hand, FSDP2), on the grading harness.

    lab05.check_memory(zero_bytes_per_rank)       # Exercise 1: model-state bytes per rank
    lab05.check_comm(zero_comm_bytes_per_rank)    # Exercise 2: bytes each rank sends per step
    lab05.check_zero1(ZeRO1)                      # Exercise 3: optimizer states sharded
    lab05.check_zero2(ZeRO2)                      # Exercise 4: gradients sharded too
    lab05.check_zero3(ZeRO3)                      # Exercise 5: parameters sharded too
    lab05.check_fsdp2(shard_with_fsdp2)           # Exercise 6: FSDP2, gradients match DDP

``formulas`` holds exercises 1 and 2, prediction exercises checked against ``parlab.cost``;
``zero`` trains exercises 3-5's answers against one process, ``rules`` states and
judges what a rank may hold, ``hints`` names the mistakes; ``fsdp`` is exercise 6.
References: Rajbhandari et al. 2020, "ZeRO: Memory Optimizations Toward Training
Trillion Parameter Models" (SC20), §5 and §7.
"""
from __future__ import annotations

from ..harness import Exercise, checker
from ..predictions import prediction
from . import formulas, fsdp, hints, rules, zero

__all__ = ["check_memory", "check_comm", "check_zero1", "check_zero2", "check_zero3", "check_fsdp2",
           "EXERCISES"]

MEMORY = prediction("lab05.memory", "zero_bytes_per_rank", call=formulas.MEMORY_CALL, unit="bytes",
                    want=formulas.memory_bytes, mistakes=formulas.memory_mistakes,
                    visible=formulas.MEMORY_VISIBLE, hidden=formulas.MEMORY_HIDDEN,
                    terms=formulas.MEMORY_TERMS)
COMM = prediction("lab05.comm", "zero_comm_bytes_per_rank", call=formulas.COMM_CALL, unit="bytes",
                  want=formulas.comm_bytes, mistakes=formulas.comm_mistakes,
                  visible=formulas.COMM_VISIBLE, hidden=formulas.COMM_HIDDEN, terms=formulas.COMM_TERMS)
_ZERO = dict(grade=zero.grade, kind="class", settle=zero.settle, timeout=120, on_hang=zero.ON_HANG,
             on_mismatch=zero.ON_MISMATCH)
ZERO1 = Exercise(key="lab05.zero1", answer="ZeRO1", run=zero.runner(1), visible=zero.PARAMS_VISIBLE,
                 hidden=zero.PARAMS_HIDDEN, rules=rules.ZERO1, on_error=hints.frozen_hint, **_ZERO)
ZERO2 = Exercise(key="lab05.zero2", answer="ZeRO2", run=zero.runner(2), visible=zero.PARAMS_VISIBLE,
                 hidden=zero.PARAMS_HIDDEN, rules=rules.ZERO2, on_error=hints.frozen_hint, **_ZERO)
ZERO3 = Exercise(key="lab05.zero3", answer="ZeRO3", run=zero.runner(3), visible=zero.LAYERS_VISIBLE,
                 hidden=zero.LAYERS_HIDDEN, rules=rules.ZERO3, on_error=hints.error_hint, **_ZERO)
FSDP2 = Exercise(key="lab05.fsdp2", answer="shard_with_fsdp2", run=fsdp.run, grade=fsdp.grade,
                 visible=fsdp.VISIBLE, hidden=fsdp.HIDDEN, rules=fsdp.RULES, settle=fsdp.settle,
                 timeout=120, on_error=fsdp.error_hint)

EXERCISES = {"memory": MEMORY, "comm": COMM, "zero1": ZERO1, "zero2": ZERO2, "zero3": ZERO3, "fsdp2": FSDP2}

check_memory = checker(MEMORY, """Exercise 1: ``fn(n_params, n, stage)`` -> model-state bytes per
rank under ZeRO stage 0-3 with mixed-precision Adam (2 + 2 + 12 bytes per parameter).""")
check_comm = checker(COMM, """Exercise 2: ``fn(n_params, n, stage, bytes_per_elem)`` -> bytes each
rank sends per training step under ZeRO stage 0-3 (ring collectives).""")
check_zero1 = checker(ZERO1, """Exercise 3: ``ZeRO1(params, make_optimizer)`` with ``.step()``:
gradients all-reduced, each rank steps its own shard, then all-gathers.  Only the parameters
that require grad are sharded; frozen ones must stay bit-identical.""")
check_zero2 = checker(ZERO2, """Exercise 4: ``ZeRO2(params, make_optimizer)``: gradients
reduce-scattered into the owned shard, the rest freed; frozen parameters as in ``ZeRO1``.""")
check_zero3 = checker(ZERO3, """Exercise 5: ``ZeRO3(layers, make_optimizer)``: parameters
sharded, each layer gathered before its forward and backward and freed after.""")
check_fsdp2 = checker(FSDP2, """Exercise 6: ``fn(model, blocks)`` applies FSDP2's ``fully_shard``
to each block, then to the root; the gradients must equal DDP's.""")
