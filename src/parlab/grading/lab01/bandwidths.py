"""Lab 01, exercise 4: algbw and busbw of an all-reduce, as nccl-tests defines them.

``fn(numel, dtype, seconds, world_size) -> (algbw, busbw)`` in GB/s (1e9 B/s):
algbw = S / t with S the tensor's size in bytes, busbw = algbw · 2(n − 1)/n
(NVIDIA nccl-tests, doc/PERFORMANCE.md).  A plain function, graded in one
process against ``parlab.cost``; a table of the values the usual mistakes give
(bits, one rank's share, elements for bytes, GiB, the wrong factor) names the
mistake.
"""
from __future__ import annotations

import torch

from ...cost import algbw as ref_algbw
from ...cost import busbw as ref_busbw
from ..harness import Exercise, Graded
from ..numbers import numbers_message
from ..plain import NUMBERS, plain

# (numel, dtype, seconds, world_size); sizes in bytes as nccl-tests counts them.
VISIBLE = ((1, ((3 * 2**18, "float64", 0.5, 2), (2**20, "float32", 0.01, 4),
                (1000, "bfloat16", 2e-5, 8))),)
HIDDEN = ((1, ((12345, "int8", 3e-4, 16), (7, "float16", 1e-6, 3),
               (2**30, "float32", 0.37, 5), (500, "int64", 1.5e-3, 1))),)


def run(fn, case, i, spy):
    numel, dtype, seconds, n = case
    with spy.watch():
        got = fn(numel, getattr(torch, dtype), seconds, n)
    if isinstance(got, (tuple, list)) and len(got) == 2:
        # a number, a one-element tensor's number, or anything else's repr
        return [plain(v, keep=NUMBERS, tensors="number", containers=(), other="repr", clip=100) for v in got]
    return {"not_a_pair": repr(got)[:200]}


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
    algs, buses = [], []
    for i, (numel, dtype, seconds, n) in enumerate(g.cases[:len(g.results[0])]):
        got = g.results[0][i]
        call = f"bandwidths(numel={numel}, dtype=torch.{dtype}, seconds={seconds}, world_size={n})"
        if isinstance(got, dict):
            if got["not_a_pair"] == "None":
                return f"{call} returned None: did you forget the `return` statement?"
            return f"{call} should return a pair (algbw, busbw), got {got['not_a_pair']}"
        k = getattr(torch, dtype).itemsize
        s = numel * k
        alg, bus = ref_algbw(s, seconds) / 1e9, ref_busbw("all_reduce", s, seconds, n) / 1e9
        alg_m, bus_m = _mistakes(n, k, alg, bus)
        algs.append((got[0], alg, f"algbw of {call}", alg_m))
        buses.append((got[1], bus, f"busbw of {call}", bus_m))
    return numbers_message(algs, unit="GB/s") or numbers_message(buses, unit="GB/s")


BANDWIDTHS = Exercise(key="lab01.bandwidths", answer="bandwidths", run=run, grade=grade,
                      visible=VISIBLE, hidden=HIDDEN, solo=True)
