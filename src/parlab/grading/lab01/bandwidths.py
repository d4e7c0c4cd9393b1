"""Lab 01, exercise 4: algbw and busbw of an all-reduce, as nccl-tests defines them.

``fn(numel, dtype, seconds, world_size) -> (algbw, busbw)`` in GB/s (1e9 B/s):
algbw = S / t with S the tensor's size in bytes, busbw = algbw · 2(n − 1)/n
(NVIDIA nccl-tests, doc/PERFORMANCE.md).  A plain function, graded in one
process against ``parlab.cost``; a table of the values the usual mistakes give
(bits, one rank's share, elements for bytes, GiB, the wrong factor) names the
mistake.  The answer is also called with numel, seconds and world_size each
doubled, so that a wrong number no known mistake explains is told which
input's dependence is wrong (``diagnosis.which_term``).
"""
from __future__ import annotations

import torch

from ...cost import algbw as ref_algbw
from ...cost import busbw as ref_busbw
from ..diagnosis import Term, which_term
from ..harness import Exercise, Graded
from ..numbers import numbers_message
from ..plain import NUMBERS, plain
from ..predictions import run_varied

# (numel, dtype, seconds, world_size); sizes in bytes as nccl-tests counts them.
VISIBLE = ((1, ((3 * 2**18, "float64", 0.5, 2), (2**20, "float32", 0.01, 4),
                (1000, "bfloat16", 2e-5, 8))),)
HIDDEN = ((1, ((12345, "int8", 3e-4, 16), (7, "float16", 1e-6, 3),
               (2**30, "float32", 0.37, 5), (500, "int64", 1.5e-3, 1))),)


#: The inputs the answer is also called with doubled (the dtype is not a number), for algbw and for
#: busbw: what depends on each.
_SIZE = Term("numel", "the message size S = numel × bytes per element", 0)
_TIME = Term("seconds", "the division by the time t", 2)
TERMS = {"algbw": (_SIZE, _TIME, Term("world_size", "a dependence on world_size (algbw = S/t has none)", 3)),
         "busbw": (_SIZE, _TIME, Term("world_size", "the all-reduce factor 2(n − 1)/n", 3))}


def _pair(got):
    """The answer's (algbw, busbw) as plain numbers, or what it returned instead."""
    if isinstance(got, (tuple, list)) and len(got) == 2:
        # a number, a one-element tensor's number, or anything else's repr
        return [plain(v, keep=NUMBERS, tensors="number", containers=(), other="repr", clip=100) for v in got]
    return {"not_a_pair": repr(got)[:200]}


def run(fn, case, i, spy):
    """The answer's pair for the case, then for the case with each of ``TERMS``' inputs doubled."""
    numel, dtype, seconds, n = case
    return run_varied(TERMS["busbw"], fn, (numel, getattr(torch, dtype), seconds, n), i, spy, as_plain=_pair)


def _reference(numel, dtype, seconds, n) -> tuple[float, float]:
    s = numel * getattr(torch, dtype).itemsize
    return ref_algbw(s, seconds) / 1e9, ref_busbw("all_reduce", s, seconds, n) / 1e9


def _which(cases: list, varied: list, k: int):
    """``differs`` for ``numbers_message``: which term of value ``k`` (0 algbw, 1 busbw) is wrong, from
    the answer's values with each input doubled (``varied``, one per case)."""
    terms = TERMS["busbw" if k else "algbw"]

    def differs(got, want, at):
        changes = [(term, pair[k], _reference(*term.vary(cases[at]))[k])
                   for term, pair in zip(terms, varied[at])
                   if isinstance(pair, list) and isinstance(pair[k], (int, float))]
        return which_term(got, want, changes)
    return differs


def _mistakes(n: int, k: int, alg: float, bus: float):
    """(value a typical mistake gives, what the mistake is) for algbw and busbw."""
    alg_m = [(alg * 8, "That is 8x too large: bits instead of bytes? S is in bytes."),
             (alg / n, "That is 1/world_size of it: S is the whole tensor, not one rank's share."),
             (alg / k, f"That is 1/{k} of it: count bytes (numel x element size), not elements.", "elements"),
             (alg * 1e9 / 2**30, "GB here means 1e9 bytes, not 2**30 (GiB)."),
             (alg * 1e9, "That is 1e9x too large: return GB/s (bytes/s divided by 1e9).")]
    bus_m = [(alg * 2, "busbw uses a factor 2; the all-reduce factor is 2(n-1)/n."),
             (alg, "busbw equals algbw: the all-reduce factor 2(n-1)/n is missing."),
             (alg * (n - 1) / n, "busbw uses (n-1)/n, the all-gather factor; an all-reduce moves "
                                 "the data twice (reduce-scatter, then all-gather): 2(n-1)/n."),
             (bus * 8, "That is 8x too large: bits instead of bytes?")]
    return alg_m, bus_m


def grade(g: Graded) -> str | None:
    """Every case's algbw, then every case's busbw: a mistake is named only when it explains every
    case (``numbers.numbers_message``)."""
    algs, buses, varied = [], [], []
    for i, (numel, dtype, seconds, n) in enumerate(g.cases[:len(g.results[0])]):
        got, others = g.results[0][i][0], g.results[0][i][1:]
        varied.append(others)
        call = f"bandwidths(numel={numel}, dtype=torch.{dtype}, seconds={seconds}, world_size={n})"
        if isinstance(got, dict):
            if got["not_a_pair"] == "None":
                return f"{call} returned None: did you forget the `return` statement?"
            return f"{call} should return a pair (algbw, busbw), got {got['not_a_pair']}"
        k = getattr(torch, dtype).itemsize
        alg, bus = _reference(numel, dtype, seconds, n)
        alg_m, bus_m = _mistakes(n, k, alg, bus)
        algs.append((got[0], alg, f"algbw of {call}", alg_m))
        buses.append((got[1], bus, f"busbw of {call}", bus_m))
    cases = g.cases[:len(varied)]
    return (numbers_message(algs, unit="GB/s", differs=_which(cases, varied, 0))
            or numbers_message(buses, unit="GB/s", differs=_which(cases, varied, 1)))


BANDWIDTHS = Exercise(key="lab01.bandwidths", answer="bandwidths", run=run, grade=grade,
                      visible=VISIBLE, hidden=HIDDEN, solo=True)
