"""Lab 05's measurements on the ranks and the rules judged on them (see ``lab05``).

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

from ...trace import _storage_bytes
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
            "layer_bytes": [_storage_bytes(m.parameters()) for m in layers],
            "grad_bytes": _storage_bytes(p.grad for p in model.parameters()),
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


def _notes(rec: dict, event: str) -> list[dict]:
    return [e for e in rec["events"] if e["event"] == event]


def optimizer_sharded(records, case, n):
    tensors = [s for k, s in enumerate(case.sizes()) if k not in case.frozen]  # Ψ: trainable only
    bound = _bound(tensors, n)
    for r, rec in enumerate(records):
        opts = _notes(rec, "optimizers")
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
        if any(c["op"] == "all_reduce" for c in rec["calls"]):
            return (f"rank {r} called dist.all_reduce: every rank then holds all the averaged "
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
        for h in _notes(rec, "held"):
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
        for h in _notes(rec, "held"):
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
        for h in _notes(rec, "held"):
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
        if any(c["op"] == "all_reduce" for c in rec["calls"]):
            return f"rank {r} called dist.all_reduce; ZeRO-3 reduce-scatters the gradients."
        gathers = [c for c in rec["calls"] if c["op"].startswith("all_gather") and c["in_backward"]]
        if len(gathers) < want:
            return (f"rank {r} all-gathered {len(gathers)} times during {backwards} backward "
                    f"passes; each of the {len(_layers(case))} layers must be gathered again "
                    f"before its backward ({want} gathers), since it was freed after its forward.")
        scatters = [c for c in rec["calls"] if c["op"].startswith("reduce_scatter") and c["in_backward"]]
        if len(scatters) < want:
            return (f"rank {r} reduce-scattered {len(scatters)} times during backward; each layer's "
                    "gradients are reduce-scattered right after its backward, so the full "
                    "gradients never stay.")
    return None


#: How torch and gloo word a collective whose sizes are not world_size equal pieces.
_UNEVEN_WORDS = ("outputShape[0] * worldSize", "inputShape[0]", "must be divisible by",
                 "Tensor input and output", "output tensor size must be equal to world_size")
UNEVEN_HINT = ("the collective's sizes were not world_size equal pieces: with Ψ not divisible by N, "
               "pad the flat vector to ceil(Ψ / N) · N elements so that every shard has "
               "ceil(Ψ / N) elements (the output of all_gather_single/reduce_scatter_single is "
               "exactly world_size × the input's elements).")


def uneven_hint(text: str) -> str:
    """The padding hint, on torch's or gloo's own wording of unequal collective sizes."""
    return UNEVEN_HINT if any(w in text for w in _UNEVEN_WORDS) else ""


def frozen_hint(text: str) -> str:
    """ZeRO-1/2: a parameter's ``.grad`` was None, as a frozen parameter's always is."""
    if hint := uneven_hint(text):
        return hint
    if "'NoneType' object has no attribute" in text or "got NoneType" in text:
        return ("a parameter's .grad was None. The check's last model has frozen parameters "
                "(requires_grad=False), which get no gradient: shard only the parameters with "
                "p.requires_grad, and leave the frozen ones untouched (filling their gradient with "
                "zeros is not the same: AdamW's weight decay would still move them).")
    return ""


def frozen_moved(where: str, s: int, got, want, case) -> str:
    """The frozen parameters changed: name them, and the zero-filled gradient if that is what it was."""
    sizes, names = case.sizes(), case.names()
    offsets = [sum(sizes[:k]) for k in range(len(sizes))]
    moved = [names[k] for k in case.frozen
             if not torch.equal(got[offsets[k]:offsets[k] + sizes[k]], want[offsets[k]:offsets[k] + sizes[k]])]
    mask = case.frozen_mask()
    decayed = (s >= 1 and case.decay != 1.0
               and bool(torch.allclose(got[mask], want[mask] * case.decay**s, rtol=1e-5, atol=1e-7)))
    why = (" They shrank by exactly AdamW's weight decay: their gradient was filled with zeros and "
           "they were stepped." if decayed else "")
    return (f"{where}, the frozen parameter(s) {', '.join(moved)} (requires_grad=False) changed "
            f"before forward {s}: single-process AdamW skips a parameter whose .grad is None, so "
            f"they must stay bit-identical.{why} Shard and step only the parameters with "
            "p.requires_grad, and never write into the frozen ones.")


def error_hint(text: str) -> str:
    if hint := uneven_hint(text):
        return hint
    if "storage" in text or "out of bounds" in text or "size 0" in text:
        return ("a layer's parameters were freed when backward needed them: backward reads the "
                "weights again, so gather them before each layer's backward (a hook on the "
                "layer's output) and free them only after.")
    return ""


# ---------------------------------------------------------------- wrong values
def wrong_params(where: str, s: int, got, want, ref: list, bad, case, n: int, every: list) -> str:
    """Name the likely mistake behind parameters that differ from single-process training."""
    count = int(bad.sum())
    head = (f"{where}, {count} of {case.numel} parameters differ from single-process training "
            f"before forward {s} (after {s} step{'s' if s != 1 else ''}).")
    stale = bad & (got == ref[0])
    if s >= 1 and bool(stale[bad].all()):
        if all(g is not None and g.shape == got.shape and bool((g == ref[0])[bad].all()) for g in every):
            moving = ~case.frozen_mask() & (ref[s] != ref[0])
            if bool(moving.any()) and bool(stale[moving].all()):
                return (head + " None of the model's parameters moved, on any rank: the updated "
                        "shards were never written back. After the shard's step, all-gather the "
                        "updated shards and copy them into the model's parameters (p.copy_ under "
                        "torch.no_grad()).")
            idx = bad.nonzero().flatten().tolist()
            return (head + f" Parameter(s) {idx} were never updated, on any rank: the shards do "
                    f"not cover every element. With Ψ = {case.trainable} not divisible by N = {n}, "
                    "the shard boundaries must still reach the last element (ceil(Ψ / N) per "
                    "rank, the last shard shorter or padded).")
        return (head + " Those parameters were never updated on this rank: only its own shard "
                "moved. All-gather the updated shards after the step, so every rank holds the "
                "whole updated model.")
    if s == 1 and case.optim == "sgd":
        d_got, d_ref = got - ref[0], ref[1] - ref[0]
        scale = float((d_got * d_ref).sum() / (d_ref * d_ref).sum()) if bool(d_ref.any()) else 0.0
        if abs(scale - n) < 1e-3 * n and n > 1:
            return (head + f" The first update is {n} = world_size times too large: the gradients "
                    "were summed over the ranks, not averaged (divide by world_size).")
        if abs(scale - 1 / n) < 1e-3:
            return head + " The first update is 1/world_size of the right one: divided twice?"
    i = int(bad.nonzero()[0])
    return head + f" The first is parameter {i}: got {float(got[i]):.6g}, expected {float(want[i]):.6g}."
