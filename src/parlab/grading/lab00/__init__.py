"""Checks for Lab 00 (setup and motivation).

    lab00.check_hello(hello)                                # Exercise 1: on 2 ranks (hidden: 3)
    lab00.check_weight_bytes(weight_bytes)                  # Exercise 2
    lab00.check_training_state_bytes(training_state_bytes)  # Exercise 3
    lab00.check_gpus_to_hold_state(gpus_to_hold_state)      # Exercise 4
    lab00.check_days_to_train(days_to_train)                # Exercise 5
    lab00.check_weight_bytes(weight_bytes, hidden=True)     # other inputs, graded only

``hello`` holds exercise 1's cases, grader and its printing rule; ``formulas``
the four memory and time formulas, graded in one process against
``parlab.cost`` with a table of the values the usual mistakes give; ``call``
the case they share, one call shown as a student would type it.
"""
from __future__ import annotations

from ..harness import checker
from .formulas import DAYS, GPUS, STATE, WEIGHTS
from .hello import HELLO

__all__ = ["check_hello", "check_weight_bytes", "check_training_state_bytes",
           "check_gpus_to_hold_state", "check_days_to_train", "EXERCISES"]

EXERCISES = {"hello": HELLO, "weight_bytes": WEIGHTS, "training_state_bytes": STATE,
             "gpus_to_hold_state": GPUS, "days_to_train": DAYS}

check_hello = checker(HELLO, "Launch hello() on 2 ranks (hidden: 3) and check what each rank "
                             "returned and printed.")
check_weight_bytes = checker(WEIGHTS, "weight_bytes(n_params, bytes_per_param) must be "
                                      "n_params × bytes_per_param bytes.")
check_training_state_bytes = checker(
    STATE, "training_state_bytes(n_params): weights + grads + Adam state = 16 bytes per parameter "
           "(ZeRO §3.1).")
check_gpus_to_hold_state = checker(
    GPUS, "gpus_to_hold_state(n_params, gpu_memory_bytes): ceil(16·n_params / memory) GPUs, as an int.")
check_days_to_train = checker(
    DAYS, "days_to_train(...) = 6·N·tokens / (GPUs × peak × MFU) / 86 400 (PaLM, appendix B).")
