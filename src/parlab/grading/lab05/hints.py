"""Lab 05, Exercises 3-5: what the grader says about a ZeRO answer that crashed or trained wrong.

``frozen_hint`` and ``error_hint`` turn a rank's error into advice, each only
on the words that show its mistake: torch's and gloo's wordings of
collective sizes that are not world_size equal pieces (an unpadded flat
vector), a None used as a tensor where the failing code reads a ``.grad`` (a
frozen parameter's is None), a tensor read after its storage was freed.  ``wrong_params`` and ``frozen_moved``
say how parameters differ from single-process training, and name the
mistake where the parameters show it: shards never written back or not
covering every element (the parameters that never moved), frozen
parameters shrunk by exactly the weight decay; otherwise which step's
update first differs and which state of the optimizers (``states``), with
a cause only when ``zero`` diagnosed one from every rank.
"""
from __future__ import annotations

import torch


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
    if ("'NoneType' object has no attribute" in text or "got NoneType" in text) and ".grad" in text:
        return ("the traceback's code reads a .grad, and a None was used as a tensor: a parameter's "
                ".grad is None when it gets no gradient. The check's last model has frozen parameters "
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
    if "storage of size 0" in text:  # torch's words for a tensor whose storage was resized to 0 (freed)
        return ("backward read a tensor whose storage had been freed (resized to 0): backward reads "
                "the weights again, so gather each layer's parameters before its backward (a hook on "
                "the layer's output) and free them only after.")
    return ""


def wrong_params(where: str, s: int, got, want, ref: list, bad, case, n: int, every: list,
                 named: str = "", state: str = "") -> str:
    """Say how parameters differ from single-process training and name the mistake the evidence
    shows: updates never written back or not reaching every element, or ``named`` (the one known
    training mistake every rank's parameters show, from ``zero``).  Otherwise which step's update
    first differs and where.  ``state`` (``states.first_difference``: which state of the optimizers
    first differs) follows the parameters' facts, before the cause."""
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
    i = int(bad.nonzero()[0])
    first = ("" if s < 1 else f" They matched it before forward {s - 1}, so step {s}'s update is the first "
             "that differs." if s > 1 else " Step 1's update, the first, differs.")
    facts = head + first + f" The first is parameter {i}: got {float(got[i]):.6g}, expected {float(want[i]):.6g}."
    return facts + (f"\n{state}" if state else "") + (f"\nHint: {named}" if named else "")
