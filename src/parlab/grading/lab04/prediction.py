"""Lab 04, exercise 5: the bubble and the activation memory predicted by formula.

The student's ``predict_pipeline(p, m, schedule, rank, mb_bytes)`` returns
(bubble, held_bytes): the idle share of a GPipe or 1F1B step on p stages with
m micro-batches, and the bytes of activations stage ``rank`` holds at its
peak.  The reference is ``parlab.cost``'s ``bubble_fraction`` and
``activations_held``; the hints name the usual wrong formulas, and the rule
(``predictions.NO_COST``) forbids calling ``parlab.cost`` itself.  The answer
is a pair, two numbers with hints of their own, where
``parlab.grading.predictions.prediction`` grades one number per call: the
runner and the grader here are this exercise's own.
"""
from __future__ import annotations

from ... import cost
from ..calls import watched_cost_call
from ..harness import Graded
from ..numbers import number_message
from ..plain import NUMBERS, plain
from ..predictions import NO_COST

RULES = (NO_COST,)

#: Test sets: ((1, ((p, m, schedule, rank, mb_bytes), ...)),).
VISIBLE = ((1, ((4, 8, "gpipe", 0, 1000), (4, 8, "1f1b", 0, 1000), (4, 8, "1f1b", 2, 4096),
                 (4, 2, "1f1b", 0, 512))),)
HIDDEN = ((1, ((8, 32, "1f1b", 3, 3 * 2**20), (2, 1, "gpipe", 1, 64), (3, 7, "1f1b", 1, 100),
                (16, 4, "1f1b", 5, 10), (6, 12, "gpipe", 5, 7))),)


def run(fn, case, i, spy):
    got = watched_cost_call(spy, fn, *case)
    if isinstance(got, (tuple, list)) and len(got) == 2:
        return [plain(v, keep=NUMBERS, tensors="number", containers=()) for v in got]
    return {"not_a_pair": repr(got)[:200]}


def grade(g: Graded) -> str | None:
    for i, (p, m, schedule, rank, mb) in enumerate(g.cases[:len(g.results[0])]):
        got = g.results[0][i]
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
            (0.0, "1F1B reorders the passes but keeps GPipe's bubble: (p − 1)/(m + p − 1)."),
            ((p - 1) / (m + p), "The step lasts m + p − 1 slots, not m + p.")]
        held_mistakes = [
            (m * mb, "That is GPipe's m micro-batches; 1F1B holds at most p − rank of them."),
            (p * mb, f"Stage {rank} holds min(p − rank, m) micro-batches, p only on stage 0 (and only "
                     "when m ≥ p)."),
            ((p - rank) * mb, f"With m = {m} < p − rank, only m micro-batches exist to hold."),
            ((p - rank - 1) * mb, "That is the warm-up forwards only: the forward of the steady phase "
                                  "is held too, min(p − rank, m) in all."),
            (held / mb if mb != 1 else -1.0, "That is a number of micro-batches: multiply by mb_bytes."),
            (min(p, m) * mb, f"Later stages hold fewer: stage {rank} holds min(p − rank, m).")]
        msg = (number_message(got[0], bubble, f"the bubble of {call}", bubble_mistakes)
               or number_message(got[1], held, f"the bytes held by {call}",
                                 [(v, w) for v, w in held_mistakes if v != held], unit="bytes"))
        if msg:
            return msg
    return None
