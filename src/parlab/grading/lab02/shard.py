"""Exercise 1b, ``my_batch(x, y)``: this rank's contiguous block of rows of x and of y.

Every rank gets the whole global batch and returns its pair; the grader compares
it with ``parlab.data.shard_batch`` and names a miss: the whole batch, strided rows,
another rank's block, y split unlike x, no return.
"""
from __future__ import annotations

import torch

from ...data import get_batch, shard_batch
from ...launch.runtime import device
from ..harness import Exercise, Graded
from ..plain import plain
from .case import DATA_SEED, TIMEOUT, Case

VISIBLE = ((2, (Case(batch=8, seq=16), Case(batch=2, seq=4))),)
HIDDEN = ((3, (Case(batch=6, seq=16), Case(batch=3, seq=5), Case(batch=12, seq=8))),)


def run(fn, case, i, spy):
    # (B, s) each: the whole global batch; the answer returns its (B/n, s) block of each
    x, y = (t.to(device()) for t in get_batch(0, case.batch, case.seq, DATA_SEED))
    with spy.watch():
        got = fn(x.clone(), y.clone())
    # what leaves the rank: tensors copied to the CPU, a list or any tuple (a namedtuple too) as a
    # tuple, other objects named
    return plain(tuple(got) if isinstance(got, (tuple, list)) else got, containers=(list, tuple),
                 other="name")


def grade(g: Graded) -> str | None:
    for i, case in enumerate(g.cases):
        x, y = get_batch(0, case.batch, case.seq, DATA_SEED)
        for r, got in enumerate(g.at(i)):
            want = shard_batch((x, y), r, g.n)
            where = f"{g.name}(x, y) for {case.describe(g.n)}, on rank {r}"
            if got is None:
                return f"{where} returned None: did you forget the `return` statement?"
            if not (isinstance(got, tuple) and len(got) == 2
                    and all(isinstance(t, torch.Tensor) for t in got)):
                what = (f"a {len(got)}-tuple" if isinstance(got, tuple) else repr(got))
                return f"{where} returned {what}; it should return a pair of tensors (x_local, y_local)."
            if got[0].shape == x.shape and g.n > 1:
                return (f"{where} returned the whole batch ({tuple(x.shape)}): every rank would "
                        f"train on all {case.batch} rows. Give rank r only its {case.batch // g.n} rows.")
            for label, t, w in zip("xy", got, want):
                if t.shape != w.shape:
                    return (f"{where} returned {label} of shape {tuple(t.shape)}, expected "
                            f"{tuple(w.shape)}: split x and y the same way, into world_size blocks.")
            if all(torch.equal(t, w) for t, w in zip(got, want)):
                continue
            blocks = [shard_batch(x, s, g.n) for s in range(g.n)]
            if torch.equal(got[0], x[r::g.n]):
                hint = ("you took every n-th row (strided, like DistributedSampler); this lab uses "
                        "contiguous blocks: rank r gets rows r*B/n .. (r+1)*B/n.")
            elif torch.equal(got[0], want[0]):
                hint = "x is right but y is not: split y exactly like x."
            elif any(torch.equal(got[0], b) for b in blocks):
                s = next(s for s, b in enumerate(blocks) if torch.equal(got[0], b))
                hint = f"that is rank {s}'s block; rank {r} gets block number {r}."
            else:
                hint = "rank r gets rows r*B/n .. (r+1)*B/n of x and of y."
            return f"{where} returned the wrong rows. Hint: {hint}"
    return None


SHARD = Exercise(key="lab02.shard", answer="my_batch", run=run, grade=grade, visible=VISIBLE,
                 hidden=HIDDEN, timeout=TIMEOUT)
