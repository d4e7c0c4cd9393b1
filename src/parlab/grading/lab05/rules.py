"""Lab 05, Exercises 3-5: the rules stated for ZeRO-1/2/3, and what a rank holds, measured to judge them.

On each rank the grader notes, through the spy, what the rank holds at each
point it looks (before every layer's forward, after every step):

- per layer, the storage bytes behind the model's parameters (a freed layer
  under ZeRO-3 holds none; a gathered one holds its full fp32 size);
- the storage bytes of the model's gradients;
- the elements handed to ``make_optimizer`` and the elements of the
  optimizer's state tensors (the 0-d ``step`` counters are not counted).

The rules compare these with what a shard may hold: the sum over the
parameter tensors of ceil(numel / N) elements is the bound (the notebook
states it so), which any contiguous sharding (of the flat vector, per
layer, or per tensor) stays under, while the full model does not.  After
each backward and each step the grader also counts what the student's
object keeps besides parameters and optimizer state (``holdings``): more
than two shards' worth is a full gradient buffer kept alive.
"""
from __future__ import annotations

import math

import torch

from ...trace import storage_bytes
from .. import records as read
from ..harness import Rule
from ..holdings import extra_bytes


# ---------------------------------------------------------------- measuring (on the ranks)
def held(model, optimizers, where: str, obj=None) -> dict:
    """What this rank holds now, as plain data (see the module docstring).

    With ``obj`` (the student's ZeRO object), also the bytes it keeps besides the parameters and
    the optimizer's state (``holdings.extra_bytes``): gradient shards and any other buffer.
    """
    layers = [m for m in model if any(True for _ in m.parameters(recurse=False))]
    extra = extra_bytes(obj, list(model.parameters()), optimizers) if obj is not None else None
    return {"where": where, "extra": extra,
            "layer_bytes": [storage_bytes(m.parameters()) for m in layers],
            "grad_bytes": storage_bytes(p.grad for p in model.parameters()),
            "opt_grad_elems": sum(p.grad.numel() for o in optimizers for g in o.param_groups
                                  for p in g["params"] if p.grad is not None)}


def optimizer_facts(opt) -> dict:
    """Elements handed to one optimizer and elements of its state tensors."""
    handed = sum(p.numel() for g in opt.param_groups for p in g["params"])
    state = sum(v.numel() for s in opt.state.values() for v in s.values()
                if isinstance(v, torch.Tensor) and v.dim() > 0)
    return {"handed": handed, "state": state}


# ---------------------------------------------------------------- reading the notes
def _bound(tensors: list[int], n: int) -> int:
    return sum(math.ceil(t / n) for t in tensors)


def optimizer_sharded(records, case, n):
    tensors = [s for k, s in enumerate(case.sizes()) if k not in case.frozen]  # Ψ: trainable only
    bound = _bound(tensors, n)
    for r, rec in enumerate(records):
        opts = read.events(rec, "optimizers")
        facts = opts[-1]["optimizers"] if opts else []
        if not facts:
            return (f"rank {r} never called make_optimizer: build the optimizer of your shard "
                    "with make_optimizer([...]), the optimizer the grader chose.")
        handed = sum(f["handed"] for f in facts)
        if handed > bound:
            full = " (the whole model: every rank steps every parameter)" if handed >= case.trainable else ""
            return (f"rank {r} handed make_optimizer {handed} elements{full}; its shard has at most "
                    f"the sum over the parameter tensors of ceil(numel / N) = {bound} elements "
                    f"(one flat shard: ceil(Ψ / N) = {math.ceil(case.trainable / n)}). The optimizer "
                    "state is then not sharded, and there is no memory saved.")
    return None


def no_all_reduce(records, case, n):
    for r, rec in enumerate(records):
        if hit := read.first(rec, "all_reduce"):
            return (f"rank {r} called {read.describe(rec, hit)}: every rank then holds all the averaged "
                    "gradients, which ZeRO-2 saves by reduce-scattering them.")
    return None


def shard_bound(case, n) -> int:
    """Elements one shard may hold: the sum over the trainable tensors of ceil(numel / N)."""
    return _bound([s for k, s in enumerate(case.sizes()) if k not in case.frozen], n)


def _kept_too_much(h: dict, r: int, case, n: int, who: str) -> str | None:
    """The object keeps more than two shards' worth of fp32 besides parameters and optimizer state."""
    extra, bound = h.get("extra"), shard_bound(case, n)
    if not extra or extra["bytes"] <= 2 * 4 * bound:
        return None
    full = " (the size of the whole gradient)" if extra["largest"] >= case.trainable else ""
    return (f"after {h['where']} rank {r}'s {who} object still keeps {extra['bytes']} bytes of "
            f"tensors besides the parameters and the optimizer's state, the largest of "
            f"{extra['largest']} elements{full}; a shard is {bound} elements ({4 * bound} bytes). "
            "A full-size gradient buffer kept between steps is the memory that sharding the "
            "gradients saves: build the flat gradient inside the step (or the hook) and let it go, "
            "keeping only your shard's gradient.")


def _grads_left(records, case, n, when: str, who: str, advice: str):
    for r, rec in enumerate(records):
        for h in read.events(rec, "held"):
            if not h["where"].startswith(when):
                continue
            if h["grad_bytes"]:
                return (f"after {h['where']} rank {r}'s model parameters still hold {who}gradients "
                        f"({h['grad_bytes']} bytes): {advice}")
            if problem := _kept_too_much(h, r, case, n, "ZeRO2" if when == "step" else "ZeRO3"):
                return problem
    return None


def grads_freed(records, case, n):
    """ZeRO-2: after each step the model's parameters hold no gradient, and the object keeps shards only."""
    return _grads_left(records, case, n, "step", "", "set p.grad = None once your shard's part is "
                       "taken, or the full gradients stay in memory.")


def full_grads_freed(records, case, n):
    """ZeRO-3: after backward the model's parameters hold no gradient, and the object keeps shards only."""
    return _grads_left(records, case, n, "backward", "their full ", "once a layer's gradients are "
                       "reduce-scattered into its shard, set p.grad = None on its parameters.")


def _gathered(h: dict, layers: list[int]) -> list[int]:
    return [k for k, (b, m) in enumerate(zip(h["layer_bytes"], layers)) if b >= 4 * m]


def _layers(case) -> list[int]:
    return [a * b + b for a, b in zip(case.dims, case.dims[1:])]


def params_freed_between_steps(records, case, n):
    layers = _layers(case)
    for r, rec in enumerate(records):
        for h in read.events(rec, "held"):
            if h["where"].startswith("backward") and (full := _gathered(h, layers)):
                return (f"after {h['where'].replace('backward', 'the backward of step')} rank {r} "
                        f"still holds the gathered parameters of layer(s) {full} "
                        f"({sum(h['layer_bytes'])} bytes of parameters): free each layer after its "
                        "backward as well as after its forward (resize the storage to 0 once its "
                        "gradients are reduce-scattered); the next forward gathers it again.")
            if h["where"].startswith("step") and (full := _gathered(h, layers)):
                return (f"after {h['where']} rank {r} still holds the full parameters of layer(s) "
                        f"{full} ({sum(h['layer_bytes'])} bytes of parameters): that is ZeRO-1 "
                        "with extra copies, not ZeRO-3. Free the gathered parameters (resize "
                        "their storage to 0) and keep only the shards.")
    return None


def layers_freed_in_forward(records, case, n):
    layers = _layers(case)
    for r, rec in enumerate(records):
        for h in read.events(rec, "held"):
            if h["where"].startswith("backward") and _gathered(h, layers):
                break  # still gathered from the backward: params_freed_between_steps says so
            if h["where"].startswith("forward") and len(full := _gathered(h, layers)) > 2:
                if h["where"].endswith(" 0"):
                    return (f"rank {r} held the full parameters of every layer {full} before the "
                            "first layer's forward: that is ZeRO-1 with extra copies, not ZeRO-3. "
                            "Keep only the shards and gather one layer at a time.")
                return (f"at the {h['where']} rank {r} held the gathered parameters of layers "
                        f"{full} at once: the gather was not freed after each layer's forward, so "
                        "the memory is not saved.")
    return None


def regathered_in_backward(records, case, n):
    backwards = case.steps + 1
    want = len(_layers(case)) * backwards
    for r, rec in enumerate(records):
        if hit := read.first(rec, "all_reduce"):
            return f"rank {r} called {read.describe(rec, hit)}; ZeRO-3 reduce-scatters the gradients."
        in_backward = read.calls(rec, backward=True)
        gathers = [c for c in in_backward if c["op"].startswith("all_gather")]
        if len(gathers) < want:
            return (f"rank {r} all-gathered {len(gathers)} times during {backwards} backward "
                    f"passes; each of the {len(_layers(case))} layers must be gathered again "
                    f"before its backward ({want} gathers), since it was freed after its forward.")
        scatters = [c for c in in_backward if c["op"].startswith("reduce_scatter")]
        if len(scatters) < want:
            return (f"rank {r} reduce-scattered {len(scatters)} times during backward; each layer's "
                    "gradients are reduce-scattered right after its backward, so the full "
                    "gradients never stay.")
    return None


# ---------------------------------------------------------------- the rules each exercise states
OWN_SHARD = Rule("Hand `make_optimizer` only this rank's shard: at most the sum over the parameter "
                 "tensors of ceil(numel / N) elements (ceil(Ψ / N) for one flat shard), so the "
                 "optimizer state is sharded too.", optimizer_sharded)

ZERO1 = (OWN_SHARD,)

ZERO2 = (OWN_SHARD,
         Rule("Reduce-scatter the gradients: no `dist.all_reduce`.", no_all_reduce),
         Rule("After `step()` no parameter of the model keeps its `.grad`, and your object keeps "
              "no full-size gradient buffer (at most two shards' worth of tensors besides the "
              "parameters and the optimizer's state): the only gradient a rank holds is its "
              "shard's.", grads_freed))

ZERO3 = (OWN_SHARD,
         Rule("Free each layer's gathered parameters after its forward: at most two layers are "
              "gathered at any time in forward.", layers_freed_in_forward),
         Rule("Between steps a rank holds only shards: the model's parameters take no memory "
              "outside a layer's forward and backward.", params_freed_between_steps),
         Rule("All-gather each layer's parameters again in backward, and reduce-scatter its "
              "gradients there: no `dist.all_reduce`.", regathered_in_backward),
         Rule("After `backward()` the only gradients a rank holds are its shards': no `p.grad` "
              "on the model's parameters, and no full-size gradient buffer kept (at most two "
              "shards' worth of tensors besides the parameters and the optimizer's state).",
              full_grads_freed))
