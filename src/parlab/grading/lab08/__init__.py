"""Checks for Lab 08: what every real configuration needs (loss scaling, clipping, checkpoints).

    lab08.check_loss_scaler(LossScaler)              # Exercise 1: fp16 loss scaling, overflow agreed by all ranks
    lab08.check_clip(clip_grad_norm_sharded)         # Exercise 2: the global gradient norm under TP and FSDP
    lab08.check_checkpoint(ShardedCheckpoint)        # Exercise 3: save shards on N ranks, load for M

``scaler`` holds exercise 1 (reference: ``torch.amp.GradScaler`` in one
process holding every rank's shard), ``clipping`` exercise 2 (reference:
``torch.nn.utils.clip_grad_norm_`` on the whole model), ``checkpoint``
exercise 3 (reference: slices of the full tensors).  Recomputation, bf16
autocast, ``torch.distributed.checkpoint`` and HSDP are measured in the
notebook, not graded.
"""
from __future__ import annotations

from ..harness import Exercise, checker
from . import checkpoint, clipping, scaler

__all__ = ["check_loss_scaler", "check_clip", "check_checkpoint", "EXERCISES"]

TIMEOUT = 60.0

SCALER = Exercise(key="lab08.scaler", answer="LossScaler", run=scaler.run, grade=scaler.grade,
                  visible=scaler.VISIBLE, hidden=scaler.HIDDEN, rules=scaler.RULES, settle=scaler.settle,
                  timeout=TIMEOUT, kind="class", on_hang=scaler.ON_HANG)
CLIP = Exercise(key="lab08.clip", answer="clip_grad_norm_sharded", run=clipping.run, grade=clipping.grade,
                visible=clipping.VISIBLE, hidden=clipping.HIDDEN, rules=clipping.RULES,
                settle=clipping.settle, timeout=TIMEOUT)
CHECKPOINT = Exercise(key="lab08.checkpoint", answer="ShardedCheckpoint", run=checkpoint.run,
                      grade=checkpoint.grade, visible=checkpoint.VISIBLE, hidden=checkpoint.HIDDEN,
                      rules=checkpoint.RULES, settle=checkpoint.settle, timeout=TIMEOUT, kind="class",
                      on_error=checkpoint.error_hint)

EXERCISES = {"scaler": SCALER, "clip": CLIP, "checkpoint": CHECKPOINT}

check_loss_scaler = checker(SCALER, """Exercise 1: ``cls(init_scale, growth_factor, backoff_factor,
growth_interval)`` with ``scale(loss)``, ``step(optimizer)``, ``update()``, ``get_scale()``: a step
is skipped on every rank when any rank's gradient overflowed.""")
check_clip = checker(CLIP, """Exercise 2: ``fn(sharded, replicated, max_norm)`` returns the whole
model's gradient norm and clips every gradient in place, as ``clip_grad_norm_`` does in one process.""")
check_checkpoint = checker(CHECKPOINT, """Exercise 3: ``cls(directory)`` with ``save(shards, shapes)``
on every rank and ``load(rank, world_size)`` returning that rank's shards for another world size.""")
