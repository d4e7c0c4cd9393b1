"""Lab 05's measurements on the ranks and the rules judged on them (see ``lab05``).

On each rank the grader notes, through the spy, what the rank holds at each
point it looks (before every layer's forward, after every step):

- per layer, the storage bytes behind the model's parameters (a freed layer
  under ZeRO-3 holds none; a gathered one holds its full fp32 size);
- the storage bytes of the model's gradients;
- the elements handed to ``make_optimizer`` and the elements of the
  optimizer's state tensors (the 0-d ``step`` counters are not counted).

The rules compare these with what a shard may hold: ceil(numel / N)
elements per parameter tensor is the bound, which any contiguous sharding
(of the flat vector, per layer, or per tensor) stays under, while the full
model does not.
"""
from __future__ import annotations

import math

import torch

from ...trace import _storage_bytes


# ---------------------------------------------------------------- measuring (on the ranks)
def held(model, optimizers, where: str) -> dict:
    """What this rank holds now, as plain data (see the module docstring)."""
    layers = [m for m in model if any(True for _ in m.parameters(recurse=False))]
    return {"where": where,
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
                    f"ceil(Ψ / N) = {math.ceil(case.trainable / n)}. The optimizer state is then not "
                    "sharded, and there is no memory saved.")
    return None


def no_all_reduce(records, case, n):
    for r, rec in enumerate(records):
        if any(c["op"] == "all_reduce" for c in rec["calls"]):
            return (f"rank {r} called dist.all_reduce: every rank then holds all the averaged "
                    "gradients, which ZeRO-2 saves by reduce-scattering them.")
    return None


def grads_freed(records, case, n):
    for r, rec in enumerate(records):
        for h in _notes(rec, "held"):
            if h["where"].startswith("step") and h["grad_bytes"]:
                return (f"after {h['where']} rank {r}'s model parameters still hold gradients "
                        f"({h['grad_bytes']} bytes): set p.grad = None once your shard's part is "
                        "taken, or the full gradients stay in memory.")
    return None


def _gathered(h: dict, layers: list[int]) -> list[int]:
    return [k for k, (b, m) in enumerate(zip(h["layer_bytes"], layers)) if b >= 4 * m]


def _layers(case) -> list[int]:
    return [a * b + b for a, b in zip(case.dims, case.dims[1:])]


def params_freed_between_steps(records, case, n):
    layers = _layers(case)
    for r, rec in enumerate(records):
        for h in _notes(rec, "held"):
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


def frozen_hint(text: str) -> str:
    """ZeRO-1/2: a parameter's ``.grad`` was None, as a frozen parameter's always is."""
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
