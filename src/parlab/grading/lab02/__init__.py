"""Checks for Lab 02: data parallelism, on the grading harness.

    lab02.check_broadcast_parameters(broadcast_parameters)   # Exercise 1a
    lab02.check_my_batch(my_batch)                           # Exercise 1b
    lab02.check_allreduce_gradients(allreduce_gradients)     # Exercise 2
    lab02.check_accumulate(accumulate_and_sync)              # Exercise 3
    lab02.check_bucketed(BucketedDP)                         # Exercise 4
    lab02.check_ddp(make_ddp)                                # Exercise 5
    lab02.check_train_hf(train_data_parallel)                # Exercise 6

The training checks run a tiny model for a few SGD steps on 2 ranks
(visible) or 3 (hidden) and compare every rank, after EVERY step, with a
single-process full-batch run (``parlab.reference.reference_steps``).  SGD,
not AdamW: multi-rank gradients agree with the reference to about 1e-8, and
AdamW would magnify that noise.  The models are awkward on purpose: parlab's
GPT ties ``lm_head`` to ``tok_emb`` (one Parameter used twice), some cases
freeze a parameter (its ``.grad`` stays None), and some of Exercise 4's add
a trainable parameter that the forward pass never uses.

This module holds the case tables, the on-rank runners and the exercise
declarations.  Each ``Rule`` below is a sentence of the notebook, verbatim,
under the exercise's "Rules (checked)", judged by ``rules`` on the
spy's records (dist calls, backward passes, DDP constructions, and the
events the runners note: ``sync`` calls, forward passes, optimizer steps);
``graders`` compares the values and writes the hints.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn as nn

from ...data import get_batch, microbatches, shard_batch
from ...models import build, lm_loss
from ...launch.runtime import device
from . import rules
from ..harness import Exercise, Rule, checker
from .graders import DATA_SEED, INIT_SEED, flat, grade_broadcast, grade_shard, grade_trained, params
from .rules import SPARE, bucket_plan

__all__ = ["check_broadcast_parameters", "check_my_batch", "check_allreduce_gradients",
           "check_accumulate", "check_bucketed", "check_ddp", "check_train_hf",
           "bucket_plan", "Case", "EXERCISES", "TIMEOUT"]

#: Seconds per launch; the process-group timeout is half of it.
TIMEOUT = 90.0
SMALL = (("n_layer", 2), ("d_model", 32), ("n_head", 2))


@dataclass(frozen=True)
class Case:
    """One test input: a model, its frozen (or unused) parameters, and the batch layout."""

    model: str = "gpt"
    overrides: tuple = SMALL
    frozen: tuple = ()
    unused: bool = False
    batch: int = 8  # global batch (all ranks together)
    seq: int = 16
    steps: int = 3
    micro: int = 1  # micro-batches per rank (gradient accumulation)
    bucket_bytes: int = 0
    lr: float = 0.1

    def build(self, seed: int) -> nn.Module:
        """The case's model, on the CPU (runners move it to the rank's device)."""
        model = build(self.model, seed=seed, **dict(self.overrides))
        if self.unused:
            model.register_parameter(SPARE, nn.Parameter(torch.full((8,), 0.5)))
        named = dict(model.named_parameters())
        for name in self.frozen:
            named[name].requires_grad_(False)
        return model

    def describe(self, n: int) -> str:
        tied = self.model == "gpt" and dict(self.overrides).get("tie_weights", True)
        parts = [self.model + (" (tied lm_head/tok_emb)" if tied else "")]
        if self.frozen:
            parts.append(f"frozen {', '.join(self.frozen)}")
        if self.unused:
            parts.append(f"a trainable parameter '{SPARE}' that forward never uses")
        parts.append(f"global batch {self.batch}")
        if self.micro > 1:
            parts.append(f"{self.micro} micro-batches per rank")
        if self.bucket_bytes:
            parts.append(f"bucket_bytes {self.bucket_bytes}")
        return ", ".join(parts) + f", world_size {n}"


# ---------------------------------------------------------------- test sets
# ((world_size, cases),).  Visible sets hold each exercise's commonest trap:
# a frozen parameter, the tied matrix, micro-batch counts other than the
# world size, a parameter exactly at the bucket_bytes boundary, an unused one.
_FROZEN = ("pos_emb.weight",)
_UNTIED = SMALL + (("tie_weights", False),)
_LM_HEAD_BYTES = 256 * 32 * 4  # untied lm_head.weight (vocab 256 x d_model 32), first in reverse
_SETS = {
    "broadcast": (((2, (Case(), Case(frozen=_FROZEN))),),
                  ((3, (Case(overrides=_UNTIED), Case(overrides=(("n_layer", 1), ("d_model", 16))))),)),
    "shard": (((2, (Case(batch=8, seq=16), Case(batch=2, seq=4))),),
              ((3, (Case(batch=6, seq=16), Case(batch=3, seq=5), Case(batch=12, seq=8))),)),
    "allreduce": (((2, (Case(batch=8), Case(batch=4, frozen=_FROZEN))),),
                  ((3, (Case(batch=6), Case(batch=12, overrides=_UNTIED,
                                            frozen=("ln_f.weight", "blocks.0.attn.q.bias")))),)),
    "accum": (((2, (Case(batch=12, micro=3), Case(batch=8, micro=4, frozen=_FROZEN))),),
              ((3, (Case(batch=12, micro=2), Case(batch=6, micro=1),
                    Case(batch=12, micro=4, overrides=_UNTIED, frozen=_FROZEN))),)),
    "bucketed": (((2, (Case(frozen=_FROZEN, bucket_bytes=1 << 30),
                       Case(frozen=_FROZEN, bucket_bytes=16_384), Case(bucket_bytes=1),
                       Case(frozen=_FROZEN, bucket_bytes=256),  # ln_f.bias + ln_f.weight: 256 B exactly
                       Case(unused=True, bucket_bytes=4096))),),
                 ((3, (Case(batch=6, overrides=_UNTIED, bucket_bytes=_LM_HEAD_BYTES),
                       Case(batch=6, overrides=_UNTIED, bucket_bytes=50_000, unused=True),
                       Case(batch=6, unused=True, frozen=_FROZEN, bucket_bytes=1 << 30))),)),
    "ddp": (((2, (Case(batch=8), Case(batch=4, frozen=_FROZEN))),), ((3, (Case(batch=6),)),)),
    "train": (((2, (Case(model="llama", overrides=(), batch=8),)),),
              ((3, (Case(model="llama", overrides=(), batch=6),
                    Case(model="gpt2", overrides=(), batch=6, steps=2))),)),
}


# ---------------------------------------------------------------- on the ranks
def _packed_params(model: nn.Module) -> torch.Tensor:
    return flat(p for _, p in model.named_parameters())


def _packed_grads(model: nn.Module) -> dict:
    """The trainable parameters' gradients, flat (zeros where None) and the names that had None."""
    trainable = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    return {"flat": flat(torch.zeros_like(p) if p.grad is None else p.grad for _, p in trainable),
            "none": [n for n, p in trainable if p.grad is None]}


def _setup(case: Case, seed: int):
    model = case.build(seed).to(device())
    return model, torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=case.lr)


def _local(case: Case, step: int):
    x, y = shard_batch(get_batch(step, case.batch, case.seq, DATA_SEED),
                       dist.get_rank(), dist.get_world_size())
    return x.to(device()), y.to(device())


def _step(model, opt) -> dict:
    grads = _packed_grads(model)
    opt.step()
    return {"grads": grads, "params": _packed_params(model)}


def _plain(x):
    """What a student returned, as plain data: tensors on the CPU, other objects named."""
    if isinstance(x, torch.Tensor):
        return x.detach().cpu().clone()
    if isinstance(x, (tuple, list)):
        return tuple(_plain(v) for v in x)
    return x if x is None or isinstance(x, (bool, int, float, str)) else f"<{type(x).__name__}>"


def _run_broadcast(fn, case, i, spy):
    model = case.build(INIT_SEED + dist.get_rank()).to(device())
    with spy.watch():
        fn(model)
    return params(model)


def _run_shard(fn, case, i, spy):
    x, y = (t.to(device()) for t in get_batch(0, case.batch, case.seq, DATA_SEED))
    with spy.watch():
        return _plain(fn(x.clone(), y.clone()))


def _run_allreduce(fn, case, i, spy):
    model, opt = _setup(case, 0)
    out = []
    for step in range(case.steps):
        x, y = _local(case, step)
        opt.zero_grad(set_to_none=True)
        lm_loss(model, x, y).backward()
        with spy.watch():
            fn(model)
        out.append(_step(model, opt))
    return out


def _run_accum(fn, case, i, spy):
    model, opt = _setup(case, 0)

    def sync(m: nn.Module) -> None:
        """The course's sync: average every gradient over the ranks."""
        spy.note("sync")
        with spy.paused():
            for p in m.parameters():
                if p.grad is not None:
                    dist.all_reduce(p.grad)
                    p.grad /= dist.get_world_size()

    out = []
    with spy.watch():
        for step in range(case.steps):
            x, y = _local(case, step)
            opt.zero_grad(set_to_none=True)
            fn(model, microbatches((x, y), case.micro), sync)
            spy.note("step")
            out.append(_step(model, opt))
    return out


def _run_bucketed(cls, case, i, spy):
    model, opt = _setup(case, 0)
    out = []
    with spy.watch():
        dp = cls(model, case.bucket_bytes)
        for step in range(case.steps):
            x, y = _local(case, step)
            opt.zero_grad(set_to_none=True)
            before = len(spy.calls)
            lm_loss(model, x, y).backward()
            dp.finish()
            out.append({**_step(model, opt), "calls": len(spy.calls) - before})
    return out


def _run_ddp(fn, case, i, spy):
    model, opt = _setup(case, INIT_SEED + dist.get_rank())
    with spy.watch():
        wrapped = fn(model)
    if not isinstance(wrapped, nn.Module):
        raise TypeError(f"make_ddp returned {type(wrapped).__name__}, not a module: return the "
                        "wrapped model")
    out = []
    for step in range(case.steps):
        x, y = _local(case, step)
        opt.zero_grad(set_to_none=True)
        lm_loss(wrapped, x, y).backward()
        out.append(_step(model, opt))
    return out


def _run_train(fn, case, i, spy):
    model, opt = _setup(case, INIT_SEED + dist.get_rank())
    out: list = []

    def seen(module, args, kwargs):  # the rows each training forward pass of this rank receives
        idx = args[0] if args else kwargs.get("input_ids", kwargs.get("idx"))
        if torch.is_grad_enabled():  # a forward under no_grad (logging a loss) trains nothing
            spy.note("forward", rows=int(idx.size(0)) if isinstance(idx, torch.Tensor) else 0)

    def before_step(*_):
        spy.note("step")
        out.append({"grads": _packed_grads(model)})

    model.register_forward_pre_hook(seen, with_kwargs=True)
    opt.register_step_pre_hook(before_step)
    opt.register_step_post_hook(lambda *_: out[-1].update(params=_packed_params(model)))
    with spy.watch():
        fn(model, opt, case.steps, case.batch, case.seq, DATA_SEED)
    return out


def _exercise(key: str, answer: str, run, grade, **kw) -> Exercise:
    visible, hidden = _SETS[key]
    return Exercise(key=f"lab02.{key}", answer=answer, run=run, grade=grade, visible=visible,
                    hidden=hidden, timeout=TIMEOUT, **kw)


BROADCAST = _exercise("broadcast", "broadcast_parameters", _run_broadcast, grade_broadcast)
SHARD = _exercise("shard", "my_batch", _run_shard, grade_shard)
ALLREDUCE = _exercise("allreduce", "allreduce_gradients", _run_allreduce,
                      grade_trained("allreduce", 0), on_hang=rules.SAME_COLLECTIVES,
                      on_mismatch=rules.SAME_COLLECTIVES, on_error=rules.none_grad_hint)
ACCUM = _exercise(
    "accum", "accumulate_and_sync", _run_accum, grade_trained("accum", 0),
    rules=(Rule("Call `backward()` once per micro-batch (one backward over the summed losses is "
                "not the exercise).", rules.one_backward_each),
           Rule("Call `sync(model)` exactly once per step, after the last micro-batch's backward.",
                rules.sync_once_at_end),
           Rule("Do not call any collective yourself: `sync` does the averaging.",
                rules.no_own_collectives)),
    on_hang="every rank must call sync(model) the same number of times.", on_error=rules.none_grad_hint)
BUCKETED = _exercise(
    "bucketed", "BucketedDP", _run_bucketed, grade_trained("bucketed", 0), kind="class",
    rules=(Rule("Start exactly one `dist.all_reduce` per bucket per step, and no other collective.",
                rules.one_per_bucket),
           Rule("Start every all-reduce with `async_op=True`.", rules.all_async),
           Rule("Start a bucket's all-reduce from the hook, during backward, as soon as its last "
                "gradient has arrived; only a bucket that never completed is started in `finish()`.",
                rules.launched_in_backward),
           Rule("Do not wait inside the hook: `finish()` waits, after backward.", rules.no_wait_in_hook),
           Rule("`finish()` waits for every all-reduce it started (`work.wait()`) before the "
                "optimizer step.", rules.all_waited)),
    on_hang="every rank must launch the same buckets in the same order, and finish() must wait for "
            "every bucket it launched (including a last, partly filled one).",
    on_error=rules.bucket_error_hint)
DDP = _exercise(
    "ddp", "make_ddp", _run_ddp, grade_trained("ddp", INIT_SEED),
    rules=(Rule("Return `model` wrapped in torch's `DistributedDataParallel`.", rules.builds_ddp),),
    on_error=rules.ddp_error_hint)
TRAIN = _exercise(
    "train", "train_data_parallel", _run_train, grade_trained("train", INIT_SEED),
    rules=(Rule("Use your own functions from this lab: do not wrap the model in torch's "
                "`DistributedDataParallel`.", rules.uses_ddp),
           Rule("Each step, run forward and backward on this rank's block of the global batch only.",
                rules.own_rows)),
    on_hang=rules.SAME_COLLECTIVES, on_error=rules.none_grad_hint)

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
