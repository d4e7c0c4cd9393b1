"""The runner the training exercises (2-6) share: a few SGD steps, compared with one process.

On the ranks, each exercise's runner builds the case's model and an SGD optimizer
(``setup``), feeds this rank its block of each step's global batch (``local_batch``)
and returns, per step, the flat gradient and parameter vectors (``step_result``):
a result of thousands of small tensors is slow to send back.  SGD, not AdamW:
multi-rank gradients agree with the reference to about 1e-8, and AdamW would
magnify that noise.

Here, ``grade_trained`` compares every rank after EVERY step with a single-process
run on the full batch, by default ``reference`` (``parlab.reference.reference_steps``
with plain SGD): first the flat vectors in two comparisons, and only when they
differ the named comparison of ``parlab.check``, a known scale factor's meaning (the
exercise's ``scales``) or the exercise's hint.  Hints read plain results only and
never raise, whatever a rank returned; the ones several exercises give are here too.

A variant exercise (another optimizer, a clipped gradient, a scaled loss) passes
its own reference to ``grade_trained``: a function ``(case, seed) -> Reference``,
or a dict of ``reference_steps`` keywords that replace the default's (for example
``{"backward": clipped}``, a function the exercise's module defines), and, on the
ranks, its optimizer to ``setup``.  ``parlab.reference`` ships to students: a
variant adds nothing there.
"""
from __future__ import annotations

import functools
from collections.abc import Callable, Mapping

import torch
import torch.distributed as dist
import torch.nn as nn

from ... import check
from ...data import get_batch, shard_batch
from ...launch.runtime import device
from ...reference import Reference, reference_steps
from ..diagnosis import diagnose, scale_fits
from ..harness import Graded
from .case import DATA_SEED, INIT_SEED, Case


# ---------------------------------------------------------------- on the ranks
def flat(tensors) -> torch.Tensor:
    """One flat CPU tensor: a result of thousands of small tensors is slow to send back."""
    return torch.cat([t.detach().reshape(-1).float().cpu() for t in tensors])


def packed_params(model: nn.Module) -> torch.Tensor:
    return flat(p for _, p in model.named_parameters())  # (P,): every parameter, in order


def packed_grads(model: nn.Module) -> dict:
    """The trainable parameters' gradients, flat (zeros where None) and the names that had None."""
    trainable = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    return {"flat": flat(torch.zeros_like(p) if p.grad is None else p.grad for _, p in trainable),
            "none": [n for n, p in trainable if p.grad is None]}


def setup(case: Case, seed: int, optimizer: Callable | None = None):
    """The case's model on this rank's device and its optimizer: plain SGD, or
    ``optimizer(params, lr=case.lr)`` (the convention of ``reference_steps``' factories)."""
    model = case.build(seed).to(device())
    params = [p for p in model.parameters() if p.requires_grad]
    return model, (optimizer or torch.optim.SGD)(params, lr=case.lr)


def local_batch(case: Case, step: int):
    # (B/n, s) each: this rank's contiguous block of the step's (B, s) global batch
    x, y = shard_batch(get_batch(step, case.batch, case.seq, DATA_SEED),
                       dist.get_rank(), dist.get_world_size())
    return x.to(device()), y.to(device())


def step_result(model, opt) -> dict:
    """The step's gradients, then the optimizer step, then the parameters it left."""
    grads = packed_grads(model)
    opt.step()
    return {"grads": grads, "params": packed_params(model)}


# ---------------------------------------------------------------- the reference
#: What a training grader compares with: ``(case, seed) -> parlab.reference.Reference``.
ReferenceFn = Callable[[Case, int], Reference]


def reference_run(case: Case, seed: int, **spec) -> Reference:
    """The case's single-process run on the full batch: ``reference_steps`` on the case's model,
    batch layout and learning rate; ``spec`` replaces any of its keywords (``optimizer``,
    ``backward``, ...)."""
    settings = dict(steps=case.steps, batch_size=case.batch, lr=case.lr, seed=DATA_SEED,
                    seq_len=case.seq)
    return reference_steps(lambda: case.build(seed), **{**settings, **spec})


@functools.lru_cache(maxsize=64)
def reference(case: Case, seed: int) -> Reference:
    """The default reference: plain SGD, the mean loss (cached: many answers share it)."""
    return reference_run(case, seed)


def as_reference(ref: ReferenceFn | Mapping) -> ReferenceFn:
    """A grader's reference from what an exercise passes: a function ``(case, seed) -> Reference``,
    or a dict of ``reference_steps`` keywords (``reference_run``'s ``spec``); cached either way."""
    if ref is reference:
        return ref
    if isinstance(ref, Mapping):
        spec = dict(ref)
        return functools.lru_cache(maxsize=64)(lambda case, seed: reference_run(case, seed, **spec))
    if callable(ref):
        return functools.lru_cache(maxsize=64)(ref)
    raise TypeError(f"a reference is a function (case, seed) -> Reference or a dict of "
                    f"reference_steps keywords, not {type(ref).__name__}")


@functools.lru_cache(maxsize=64)
def _names(case: Case, seed: int) -> tuple[list, list]:
    """(every parameter's (name, shape), the trainable ones), in ``named_parameters`` order."""
    model = case.build(seed)
    every = [(n, p.shape) for n, p in model.named_parameters()]
    trainable = [(n, p.shape) for n, p in model.named_parameters() if p.requires_grad]
    return every, trainable


@functools.lru_cache(maxsize=64)
def _layout(ref_fn: ReferenceFn, case: Case, seed: int) -> tuple[list, list, list]:
    """(every parameter's (name, shape), the trainable ones, the reference's flat steps)."""
    every, trainable = _names(case, seed)
    steps = [(flat(s.grads.get(n, torch.zeros(shape)) for n, shape in trainable),
              flat(s.params[n] for n, _ in every)) for s in ref_fn(case, seed).steps]
    return every, trainable, steps


def _unflat(vector, layout, none=()) -> dict:
    """Named tensors back from a flat one (None where listed); {} if the sizes do not fit."""
    sizes = [shape.numel() for _, shape in layout]
    if not isinstance(vector, torch.Tensor) or vector.numel() != sum(sizes):
        return {}
    return {n: None if n in none else t.view(shape)
            for (n, shape), t in zip(layout, torch.split(vector, sizes))}


def _ratio(f: float) -> str:
    return f"{round(f)}x" if f >= 1 else f"1/{round(1 / f)} of"


def _compare(g: Graded, i: int, case: Case, seed: int, scales, hint, ref_fn: ReferenceFn) -> str | None:
    """The first step at which a rank's gradients or parameters leave the reference."""
    runs, ref = g.at(i), ref_fn(case, seed)
    every, trainable, expected = _layout(ref_fn, case, seed)
    for r, steps in enumerate(runs):
        if len(steps) != len(ref.steps):
            return f"rank {r} took {len(steps)} optimizer steps, expected {len(ref.steps)}."
    for s, want in enumerate(ref.steps):
        for r in range(g.n):
            st = runs[r][s]
            if (not st["grads"]["none"] and check.same_values(st["grads"]["flat"], expected[s][0])
                    and check.same_values(st["params"], expected[s][1])):
                continue  # the common case, in two comparisons
            got, msg = _unflat(st["grads"]["flat"], trainable, st["grads"]["none"]), None
            missing = [k for k in want.grads if got.get(k) is None]
            left = [k for k in got if k not in want.grads and got[k] is None]
            scale = check.grad_scale(got, want.grads)
            named = _scale_named(g, i, s, trainable, want.grads, scales(case, g.n)) if scale else ""
            if missing:
                msg = (f"rank {r}: {len(missing)} trainable parameters have no gradient (None), "
                       f"e.g. '{missing[0]}'.")
            elif left:
                msg = (f"rank {r}: '{left[0]}' got no gradient in backward, so after finish() it "
                       "must hold the average over ranks, zeros here; its p.grad is None.")
            elif named:
                return (f"rank {r}: every gradient used by step {s + 1} is {_ratio(scale)} the "
                        f"single-process full-batch reference.\nHint: {named}")
            else:
                try:
                    # no world_size: this grader's own every-rank diagnosis (above) found no cause, and
                    # one rank's gradients cannot tell the ranks' sum from another scaled loss
                    check.assert_grads_match({k: got[k] for k in want.grads}, want.grads, rank=r)
                    check.assert_params_match(_unflat(st["params"], every), want.params, rank=r)
                except AssertionError as err:
                    msg = str(err)
            if msg:
                why = hint(g, i, case, s, r)
                return (f"the gradients or parameters of step {s + 1} do not match the "
                        f"single-process full-batch reference.\n{msg}"
                        + (f"\nHint: {why}" if why else ""))
    return None


def _scale_named(g: Graded, i: int, s: int, trainable, want: dict, scales) -> str:
    """The one known scale mistake whose factor every rank's gradients of step ``s`` show, or ""."""
    pieces = []
    for steps in g.at(i):
        st = steps[s]
        got = _unflat(st["grads"]["flat"], trainable, st["grads"]["none"])
        pieces.append(scale_fits(check.grad_scale(got, want), [(why, f, why) for f, why in scales]))
    return diagnose(pieces)


def grade_trained(seed: int, scales, hint, reference: ReferenceFn | Mapping = reference):
    """The grader of a training exercise whose ranks start from ``seed`` (0, or ``INIT_SEED + rank``
    compared with rank 0's model).  ``scales(case, n)`` lists ``(gradient / reference, what it
    means)``; ``hint(g, i, case, step, rank)`` explains any other miss, or returns "".
    ``reference`` is what the ranks must reproduce (see ``as_reference``); by default one
    process with plain SGD on the mean loss."""
    ref_fn = as_reference(reference)

    def grade(g: Graded) -> str | None:
        for i, case in enumerate(g.cases):
            msg = _compare(g, i, case, seed, scales, hint, ref_fn)
            if msg:
                return f"{g.name} is wrong for {case.describe(g.n)}: {msg}"
        return None
    grade.reference = ref_fn  # what it compares with: (case, seed) -> Reference
    return grade


# ---------------------------------------------------------------- what several exercises say
SUMMED = "summed, not averaged: after the all_reduce (a SUM) divide by the world size, or use ReduceOp.AVG."
TWICE = "divided by the world size twice (ReduceOp.AVG already divides)."
NOT_BACK = ("or the reduced values never reached p.grad: torch.cat makes a copy, so copy the "
            "{what} back into each p.grad{when}.")
SAME_COLLECTIVES = ("every rank must make the same collectives, in the same order, with the same sizes; "
                    "skip a parameter whose .grad is None (frozen) on EVERY rank.")


def sum_or_twice(case: Case, n: int) -> list:
    """An all-reduce that forgot to divide, or divided twice."""
    return [(n, SUMMED), (1 / n, TWICE)]


def ranks_differ(g: Graded, i: int, s: int) -> bool:
    grads = [out[s]["grads"]["flat"] for out in g.at(i)]
    return any(not check.same_values(other, grads[0]) for other in grads[1:])


@functools.lru_cache(maxsize=64)
def _initial_flat(case: Case, seed: int) -> torch.Tensor:
    return packed_params(case.build(seed))


def started_from(g: Graded, i: int, case: Case, seed: int) -> list[str]:
    """Per rank, whose initial weights its first optimizer step started from: "own", "rank 0"
    (the same for rank 0), or "" (neither, or no gradient to undo the step with).

    Read from the evidence: with plain SGD the weights before a step are the weights after it
    plus lr × the gradient it used (frozen parameters do not move).
    """
    every, trainable = _names(case, seed)
    names = [n for n, _ in every]
    sizes = [shape.numel() for _, shape in every]
    out = []
    for r, steps in enumerate(g.at(i)):
        try:
            step = steps[0]
            grads = _unflat(step["grads"]["flat"], trainable, step["grads"]["none"])
            if not grads or step["grads"]["none"]:
                out.append("")
                continue
            after = dict(zip(names, torch.split(step["params"], sizes)))
            before = torch.cat([(after[n] + case.lr * grads[n].reshape(-1)) if n in grads else after[n]
                                for n in names])
            own, first = _initial_flat(case, seed + r), _initial_flat(case, seed)
            out.append("own" if r and check.same_values(before, own) else
                       "rank 0" if check.same_values(before, first) else "")
        except (IndexError, KeyError, TypeError, RuntimeError, ValueError):
            out.append("")
    return out


def hint_replicated(g, i, case, s, r) -> str:
    """For an answer whose ranks start from different weights (exercises 5 and 6): the broadcast
    is named only when every rank but 0 took its first step from its own initial weights."""
    if ranks_differ(g, i, s):
        return "the ranks used different gradients: were they synchronised (all-reduced) at all?"
    if s == 0 and g.n > 1:
        start = started_from(g, i, case, INIT_SEED)
        if all(w == "own" for w in start[1:]):
            return ("the ranks start from different random weights: only rank 0's initial parameters "
                    "are the reference, so they must be broadcast first.")
        if all(w == "rank 0" for w in start):
            return ("every rank took its first step from rank 0's initial weights and the ranks agree "
                    "on the gradient, so the broadcast and the averaging are not what differs: the "
                    "averaged gradient of step 1 is not the full batch's (what each rank's forward "
                    "and backward ran on: its own block of the global batch, and its loss).")
    return ""


def none_grad_hint(text: str) -> str:
    if "NoneType" in text and "grad" in text:
        return ("a parameter without a gradient has p.grad None: a frozen one (requires_grad=False) "
                "never gets one; skip it, on every rank.")
    return ""
