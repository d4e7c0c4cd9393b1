"""How far a data-parallel run drifts from the single-process reference.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/accuracy.py

Two gloo ranks train parlab's tiny GPT for 3 steps, each on its half of the
global batch, averaging gradients with one all_reduce per parameter; the
reference trains the same model on the full batch in one process
(``parlab.reference.reference_steps``).  Printed: the largest absolute
difference of any gradient and any parameter after each step, for SGD and
for AdamW.  The differences come only from the order in which float32 sums
are added, and they are what ``parlab.check.tolerances`` must leave room for.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

import parlab
from parlab.data import get_batch, shard_batch
from parlab.models import build, lm_loss
from parlab.reference import make_optimizer, reference_steps

STEPS, BATCH, SEQ = 3, 8, 32


def data_parallel(optimizer: str) -> list[dict]:
    rank, n = dist.get_rank(), dist.get_world_size()
    model = build("gpt", seed=0)
    opt = make_optimizer(optimizer, list(model.parameters()), None)
    out = []
    for step in range(STEPS):
        x, y = shard_batch(get_batch(step, BATCH, SEQ, 0), rank, n)
        opt.zero_grad(set_to_none=True)
        lm_loss(model, x, y).backward()
        for p in model.parameters():
            dist.all_reduce(p.grad, op=dist.ReduceOp.AVG)
        grads = {k: p.grad.clone() for k, p in model.named_parameters()}
        opt.step()
        out.append({"grads": grads, "params": {k: p.detach().clone() for k, p in model.named_parameters()}})
    return out


def largest_gap(got: dict, want: dict) -> float:
    return max(float((got[k] - want[k]).abs().max()) for k in want)


def main() -> None:
    for optimizer in ("sgd", "adamw"):
        ref = reference_steps("gpt", steps=STEPS, batch_size=BATCH, optimizer=optimizer, seed=0,
                              seq_len=SEQ)
        run = parlab.launch(data_parallel, args=(optimizer,), nproc=2)[0]
        for s, want in enumerate(ref.steps):
            print(f"{optimizer:5s} step {s + 1}: max |grad - ref| = {largest_gap(run[s]['grads'], want.grads):.2e}"
                  f"   max |param - ref| = {largest_gap(run[s]['params'], want.params):.2e}")


if __name__ == "__main__":
    main()
