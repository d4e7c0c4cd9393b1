"""Single-process reference training runs: what a parallel run must reproduce.

``reference_steps`` trains a fresh model on the FULL global batch in one
process, in float32, and records after every step the loss, every gradient and
every parameter.  A lab then runs the same steps on several ranks (each on its
shard of the same batches, see ``parlab.data.shard_batch``) and compares.

What to expect when comparing (measured: docs/accuracy.md, benchmarks/accuracy.py):

- gradients and SGD parameters agree to about 1e-8, not bit for bit, because a
  sum split over ranks is added in a different order.  Compare with
  tolerances near 1e-6.
- AdamW divides by the square root of a tiny second moment and magnifies that
  noise in the parameters (about 50x in 3 steps on the tiny GPT).  So the default
  optimizer is SGD; with AdamW compare losses and gradients, not parameters.

Conventions of the recorded dicts (names as ``model.named_parameters()``):

- ``grads`` holds only parameters that require a gradient and received one.
  A frozen parameter (``requires_grad=False``) has no entry.
- ``params`` holds every parameter, frozen ones included.
- A tied matrix is one Parameter, and ``named_parameters`` lists it once,
  under the first name it was registered as: the input embedding
  (``tok_emb.weight`` for parlab's GPT, ``transformer.wte.weight`` for GPT-2).

A variant of the training step (a clipped gradient, a scaled loss, another
loss) is a ``backward`` function passed to ``reference_steps``, written where
the exercise is declared, and another optimizer is an ``optimizer`` factory:
neither needs a new keyword here.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Callable, Union

import torch
import torch.nn as nn

from .data import get_batch, microbatches
from .models import build, lm_loss

ModelSpec = Union[str, Callable[[], nn.Module], nn.Module]
OptimizerSpec = Union[str, Callable[..., torch.optim.Optimizer]]

DEFAULT_LR = {"sgd": 0.1, "adamw": 1e-3}


@dataclass
class StepRecord:
    """One training step: the batch, its loss, the gradients, the new params."""

    loss: float
    grads: dict[str, torch.Tensor]
    params: dict[str, torch.Tensor]
    x: torch.Tensor
    y: torch.Tensor


@dataclass
class Reference:
    """A recorded run.  ``initial`` holds the parameters before step 0."""

    initial: dict[str, torch.Tensor]
    steps: list[StepRecord] = field(default_factory=list)
    settings: dict = field(default_factory=dict)

    @property
    def losses(self) -> list[float]:
        return [s.loss for s in self.steps]

    @property
    def grads(self) -> list[dict[str, torch.Tensor]]:
        return [s.grads for s in self.steps]

    @property
    def params(self) -> list[dict[str, torch.Tensor]]:
        return [s.params for s in self.steps]


def make_model(model: ModelSpec, seed: int = 0) -> nn.Module:
    """A fresh float32 model from a name, a zero-argument factory, or a module
    (which is deep-copied, so the caller's copy is left untouched)."""
    if isinstance(model, str):
        m = build(model, seed=seed)
    elif isinstance(model, nn.Module):
        m = copy.deepcopy(model)
    elif callable(model):
        m = model()
    else:
        raise TypeError(f"expected a model name, a factory or a module, got {type(model).__name__}")
    return m.float()


def make_optimizer(opt: OptimizerSpec, params: list[nn.Parameter], lr: float | None
                   ) -> torch.optim.Optimizer:
    """"sgd" (plain, no momentum) or "adamw" (torch defaults), or a factory
    called as ``opt(params, lr=lr)``."""
    if callable(opt):
        return opt(params, lr=lr)
    if opt not in DEFAULT_LR:
        raise ValueError(f"unknown optimizer {opt!r}: use 'sgd', 'adamw' or a factory")
    lr = DEFAULT_LR[opt] if lr is None else lr
    if opt == "sgd":
        return torch.optim.SGD(params, lr=lr)
    return torch.optim.AdamW(params, lr=lr)


def _snapshot(model: nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.detach().cpu().clone() for n, p in model.named_parameters()}


Backward = Callable[[nn.Module, torch.Tensor, torch.Tensor, int], float]


def mean_backward(net: nn.Module, x: torch.Tensor, y: torch.Tensor, grad_accum: int) -> float:
    """The default step's gradients: ``(x, y)`` in ``grad_accum`` equal micro-batches, each loss
    divided by ``grad_accum`` before its backward; returns the full-batch mean loss."""
    total = 0.0
    for xm, ym in microbatches((x, y), grad_accum):
        loss = lm_loss(net, xm, ym) / grad_accum
        loss.backward()
        total += loss.item()
    return total


def reference_steps(
    model: ModelSpec = "gpt",
    steps: int = 3,
    batch_size: int = 8,
    lr: float | None = None,
    optimizer: OptimizerSpec = "sgd",
    seed: int = 0,
    seq_len: int = 32,
    grad_accum: int = 1,
    backward: Backward = mean_backward,
) -> Reference:
    """Train ``steps`` steps on full batches in this process and record them.

    ``model`` is "gpt" / "llama" / "gpt2" (built with ``seed``), a factory
    returning a fresh model (for example one with a frozen parameter), or a
    module to copy.  Step i trains on ``get_batch(i, batch_size, seq_len,
    seed)``.  ``lr=None`` means 0.1 for SGD and 1e-3 for AdamW.

    With ``grad_accum=k`` each batch is split into k equal micro-batches
    (``parlab.data.microbatches``) and each micro-batch loss is divided by k
    before ``backward``, so the summed gradient is the full-batch mean
    gradient, and the recorded loss is the full-batch mean loss.

    ``backward(net, x, y, grad_accum)`` fills the gradients of one step
    (they are zeroed before it) and returns the loss to record; the default
    is ``mean_backward``.  A variant composes it: clip after it, or scale
    the loss inside its own.  The gradients recorded are the ones it leaves,
    the ones the optimizer step uses.
    """
    net = make_model(model, seed).train()
    trainable = [p for p in net.parameters() if p.requires_grad]
    opt = make_optimizer(optimizer, trainable, lr)
    ref = Reference(initial=_snapshot(net), settings=dict(
        model=model if isinstance(model, str) else type(net).__name__, steps=steps,
        batch_size=batch_size, lr=opt.param_groups[0]["lr"], optimizer=optimizer,
        seed=seed, seq_len=seq_len, grad_accum=grad_accum,
        backward=getattr(backward, "__name__", type(backward).__name__)))
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)  # only matters if the model uses dropout
        for step in range(steps):
            x, y = get_batch(step, batch_size, seq_len, seed)
            opt.zero_grad(set_to_none=True)
            total = float(backward(net, x, y, grad_accum))
            grads = {n: p.grad.detach().cpu().clone()
                     for n, p in net.named_parameters() if p.grad is not None}
            opt.step()
            ref.steps.append(StepRecord(total, grads, _snapshot(net), x, y))
    return ref
