"""Lab 03, exercise 6: the bytes each rank sends per layer per step under Megatron TP (a formula).

``tp_bytes_per_layer(b, s, h, t, bytes_per_element)`` is a prediction
exercise (``parlab.grading.predictions``): graded in one process against
``parlab.cost``, a wrong number gets a hint from the mistake it matches
(forward only, both ways twice, no ring factor, bits, elements), and the
formula must be written out, not taken from ``parlab.cost``.
"""
from __future__ import annotations

from ...cost import comm_bytes, tp_comm_elems_per_layer
from ..diagnosis import Term
from ..predictions import prediction


def _bytes(b, s, h, t, k) -> float:
    return comm_bytes(tp_comm_elems_per_layer(b, s, h, t), k)


def _mistakes(b, s, h, t, k) -> list[tuple[float, str]]:
    want = _bytes(b, s, h, t, k)
    return [(want / 2, "That is half: count backward too (two all-reduces in forward, two in "
                       "backward)."),
            (want * 2, "That is twice too much: f and g each make ONE all-reduce per "
                       "sublayer, two per layer in forward and two in backward."),
            (8 * b * s * h * k,
             "The ring factor (t − 1)/t is missing: a ring all-reduce sends 2(t − 1)/t "
             "of the tensor per rank."),
            (want * 8, "That is 8x too large: bits instead of bytes?"),
            (want / k, "That is the number of elements: multiply by bytes_per_element.")]


BYTES = prediction("lab03.bytes", "tp_bytes_per_layer",
                   call="tp_bytes_per_layer(b={}, s={}, h={}, t={}, bytes_per_element={})",
                   want=_bytes, mistakes=_mistakes, unit="bytes",
                   terms=(Term("b", "the size of each all-reduced tensor (b·s·h)", 0),
                          Term("s", "the size of each all-reduced tensor (b·s·h)", 1),
                          Term("h", "the size of each all-reduced tensor (b·s·h)", 2),
                          Term("t", "the ring factor 2(t − 1)/t", 3),
                          Term("bytes_per_element", "the bytes per element", 4)),
                   visible=((3, 7, 5, 4, 4), (4, 1024, 4096, 8, 2), (1, 32, 64, 2, 2)),
                   hidden=((2, 2048, 8192, 4, 2), (5, 11, 13, 3, 4), (1, 1, 1, 1, 2)))
