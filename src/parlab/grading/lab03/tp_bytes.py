"""Lab 03, exercise 6: the bytes each rank sends per layer per step under Megatron TP (a formula).

``tp_bytes_per_layer(b, s, h, t, bytes_per_element)`` is graded in one
process against ``parlab.cost``; a wrong number gets a hint from the
mistake it matches (forward only, both ways twice, no ring factor, bits,
elements).  The rule: the formula is written out, not taken from
``parlab.cost``.
"""
from __future__ import annotations

from ...cost import comm_bytes, tp_comm_elems_per_layer
from .. import assert_number
from ..calls import NO_COST_SAYS, no_cost_calls, watched_cost_call
from ..harness import Exercise, Graded, Rule

VISIBLE = ((1, ((3, 7, 5, 4, 4), (4, 1024, 4096, 8, 2), (1, 32, 64, 2, 2))),)
HIDDEN = ((1, ((2, 2048, 8192, 4, 2), (5, 11, 13, 3, 4), (1, 1, 1, 1, 2))),)


def run(fn, case, i, spy):
    from ..numbers import plain_number

    return plain_number(watched_cost_call(spy, fn, *case))


def grade(g: Graded) -> str | None:
    for i, (b, s, h, t, k) in enumerate(g.cases[:len(g.results[0])]):
        want = comm_bytes(tp_comm_elems_per_layer(b, s, h, t), k)
        call = f"tp_bytes_per_layer(b={b}, s={s}, h={h}, t={t}, bytes_per_element={k})"
        mistakes = [(want / 2, "That is half: count backward too (two all-reduces in forward, two in "
                               "backward)."),
                    (want * 2, "That is twice too much: f and g each make ONE all-reduce per "
                               "sublayer, two per layer in forward and two in backward."),
                    (8 * b * s * h * k if t > 1 else -1.0,
                     "The ring factor (t − 1)/t is missing: a ring all-reduce sends 2(t − 1)/t "
                     "of the tensor per rank."),
                    (want * 8, "That is 8x too large: bits instead of bytes?"),
                    (want / k, "That is the number of elements: multiply by bytes_per_element.")]
        try:
            assert_number(g.results[0][i], want, call, mistakes, unit="bytes")
        except AssertionError as err:
            return str(err)
    return None


BYTES = Exercise(key="lab03.bytes", answer="tp_bytes_per_layer", run=run, grade=grade, visible=VISIBLE,
                 hidden=HIDDEN, rules=(Rule(NO_COST_SAYS, no_cost_calls),), solo=True)
