"""Lab 04, exercise 5: the bubble and the activation memory predicted by formula.

The student's ``predict_pipeline(p, m, schedule, rank, mb_bytes)`` returns
(bubble, held_bytes): the idle share of a GPipe or 1F1B step on p stages with
m micro-batches, and the bytes of activations stage ``rank`` holds at its
peak.  The reference is ``parlab.cost``'s ``bubble_fraction`` and
``activations_held``; the hints name the usual wrong formulas, and the rule
(``predictions.NO_COST``) forbids calling ``parlab.cost`` itself.  The answer
is a pair, two numbers with hints of their own, where
``parlab.grading.predictions.prediction`` grades one number per call: the
runner and the grader here are this exercise's own.  The answer is also
called with each of p, m, rank and mb_bytes doubled (``TERMS``), so that a
wrong number no known mistake explains is told which input's dependence is
wrong (``diagnosis.which_term``).
"""
from __future__ import annotations

from functools import partial

from ... import cost
from ...parallel.pp_schedule import warmup_forwards
from ..diagnosis import Term, which_term
from ..harness import Graded
from ..numbers import numbers_message
from ..plain import NUMBERS, plain
from ..predictions import NO_COST, run_varied

RULES = (NO_COST,)

#: Test sets: ((1, ((p, m, schedule, rank, mb_bytes), ...)),).
VISIBLE = ((1, ((4, 8, "gpipe", 0, 1000), (4, 8, "1f1b", 0, 1000), (4, 8, "1f1b", 2, 4096),
                 (4, 2, "1f1b", 0, 512))),)
HIDDEN = ((1, ((8, 32, "1f1b", 3, 3 * 2**20), (2, 1, "gpipe", 1, 64), (3, 7, "1f1b", 1, 100),
                (16, 4, "1f1b", 5, 10), (6, 12, "gpipe", 5, 7))),)


#: The inputs the answer is also called with doubled, to say which one's dependence is wrong.
TERMS = (Term("p", "the dependence on the number of stages", 0),
         Term("m", "the dependence on the number of micro-batches", 1),
         Term("rank", "the dependence on the stage (later stages hold fewer micro-batches)", 3),
         Term("mb_bytes", "the bytes per micro-batch", 4))


def _pair(got):
    """The answer's (bubble, held_bytes) as plain numbers, or what it returned instead."""
    if isinstance(got, (tuple, list)) and len(got) == 2:
        return [plain(v, keep=NUMBERS, tensors="number", containers=()) for v in got]
    return {"not_a_pair": repr(got)[:200]}


run = partial(run_varied, TERMS, as_plain=_pair)


def _reference(p, m, schedule, rank, mb) -> tuple[float, float] | None:
    """(bubble, held bytes) from ``parlab.cost``, or None for inputs it refuses (a doubled rank past
    the last stage)."""
    try:
        return cost.bubble_fraction(p, m, schedule), cost.activations_held(p, m, schedule, rank) * mb
    except ValueError:
        return None


def _which(case: tuple, varied: list, k: int):
    """``differs`` for ``numbers_message``: which term of value ``k`` (0 bubble, 1 held) is wrong,
    from the answer's values with each input doubled (``varied``, one per case)."""
    def differs(got, want, at):
        changes = []
        for term, pair in zip(TERMS, varied[at]):
            ref = _reference(*term.vary(case[at]))
            # an input that cannot double here, or an answer that gave no pair of numbers for it,
            # says nothing about that input
            if ref is None or not isinstance(pair, list) or not isinstance(pair[k], (int, float)):
                continue
            changes.append((term, pair[k], ref[k]))
        return which_term(got, want, changes)
    return differs


def grade(g: Graded) -> str | None:
    """Every case's bubble, then every case's bytes held: a mistake is named only when it explains
    every case (``numbers.numbers_message``)."""
    bubbles, helds, varied = [], [], []
    for i, (p, m, schedule, rank, mb) in enumerate(g.cases[:len(g.results[0])]):
        got, others = g.results[0][i][0], g.results[0][i][1:]
        varied.append(others)
        call = f"{g.name}(p={p}, m={m}, schedule={schedule!r}, rank={rank}, mb_bytes={mb})"
        if isinstance(got, dict) and "not_a_pair" in got:
            if got["not_a_pair"] == "None":
                return f"{call} returned None: did you forget the `return` statement?"
            return f"{call} should return a pair (bubble, held_bytes), got {got['not_a_pair']}"
        bubble = cost.bubble_fraction(p, m, schedule)
        held = cost.activations_held(p, m, schedule, rank) * mb
        bubble_mistakes = [
            (cost.bubble_fraction(p, m, schedule, definition="megatron"),
             "That is (p − 1)/m, idle time relative to the IDEAL time (Megatron's definition); "
             "this asks for idle time as a share of the whole step, (p − 1)/(m + p − 1)."),
            (0.0 if schedule == "1f1b" else None,
             "1F1B reorders the passes but keeps GPipe's bubble: (p − 1)/(m + p − 1)."),
            ((p - 1) / (m + p), "The step lasts m + p − 1 slots, not m + p.")]
        # the 1F1B mistakes do not apply to a GPipe case (None), which holds all m micro-batches
        one_f = (lambda v: v) if schedule == "1f1b" else (lambda v: None)
        held_mistakes = [
            (one_f(m * mb), "That is GPipe's m micro-batches; 1F1B holds at most p − rank of them."),
            (one_f(p * mb), f"Stage {rank} holds min(p − rank, m) micro-batches, p only on stage 0 (and only "
                     "when m ≥ p).", "p everywhere"),
            (one_f((p - rank) * mb), f"With m = {m} < p − rank, only m micro-batches exist to hold.", "m ignored"),
            (one_f(warmup_forwards(p, m, rank) * mb),
             "That is the warm-up forwards only: the forward of the steady phase is held too, "
             "min(p − rank, m) in all."),
            (held / mb if mb != 1 else None, "That is a number of micro-batches: multiply by mb_bytes."),
            (one_f(min(p, m) * mb), f"Later stages hold fewer: stage {rank} holds min(p − rank, m).", "rank ignored")]
        bubbles.append((got[0], bubble, f"the bubble of {call}", bubble_mistakes))
        helds.append((got[1], held, f"the bytes held by {call}", [x for x in held_mistakes if x[0] != held]))
    cases = g.cases[:len(varied)]
    return (numbers_message(bubbles, differs=_which(cases, varied, 0))
            or numbers_message(helds, unit="bytes", differs=_which(cases, varied, 1)))
