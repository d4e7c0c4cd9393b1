"""Checks for Lab 02: data parallelism, on the grading harness.

    lab02.check_broadcast_parameters(broadcast_parameters)   # Exercise 1a
    lab02.check_my_batch(my_batch)                           # Exercise 1b
    lab02.check_allreduce_gradients(allreduce_gradients)     # Exercise 2
    lab02.check_accumulate(accumulate_and_sync)              # Exercise 3
    lab02.check_bucketed(BucketedDP)                         # Exercise 4
    lab02.check_ddp(make_ddp)                                # Exercise 5
    lab02.check_train_hf(train_data_parallel)                # Exercise 6

One module per exercise (``broadcast``, ``shard``, ``allreduce``, ``accum``,
``bucketed``, ``ddp``, ``train``) holds its cases, on-rank runner, grader, rules
(each ``Rule`` a sentence of the notebook's "Rules (checked)", verbatim) and
hints.  ``case`` is the test input they share; ``training`` the runner of
exercises 2-6: a few SGD steps on 2 ranks (visible) or 3 (hidden), every rank
compared after EVERY step with one process on the full batch.
"""
from __future__ import annotations

from ..harness import checker
from .accum import ACCUM
from .allreduce import ALLREDUCE
from .broadcast import BROADCAST
from .bucketed import BUCKETED, bucket_plan
from .case import TIMEOUT, Case
from .ddp import DDP
from .shard import SHARD
from .train import TRAIN

__all__ = ["check_broadcast_parameters", "check_my_batch", "check_allreduce_gradients",
           "check_accumulate", "check_bucketed", "check_ddp", "check_train_hf",
           "bucket_plan", "Case", "EXERCISES", "TIMEOUT"]

EXERCISES = {"broadcast": BROADCAST, "shard": SHARD, "allreduce": ALLREDUCE, "accum": ACCUM,
             "bucketed": BUCKETED, "ddp": DDP, "train": TRAIN}

check_broadcast_parameters = checker(BROADCAST, """Exercise 1a: ``fn(model)`` copies rank 0's
parameters into every rank's model, in place.""")
check_my_batch = checker(SHARD, """Exercise 1b: ``fn(x, y)`` returns this rank's contiguous block of
rows of x and of y.""")
check_allreduce_gradients = checker(ALLREDUCE, """Exercise 2: after backward, ``fn(model)`` leaves
the average over ranks in every ``p.grad``.""")
check_accumulate = checker(ACCUM, """Exercise 3: ``fn(model, micro_batches, sync)`` accumulates the
mean gradient and calls ``sync`` once, after the last backward.""")
check_bucketed = checker(BUCKETED, """Exercise 4: ``cls(model, bucket_bytes)`` all-reduces buckets
from gradient hooks during backward; ``finish()`` waits and averages.""")
check_ddp = checker(DDP, """Exercise 5: ``fn(model)`` returns the model wrapped in torch's
DistributedDataParallel.""")
check_train_hf = checker(TRAIN, """Exercise 6: ``fn(model, optimizer, steps, batch_size, seq_len,
seed)`` trains data-parallel with your own functions.""")
