"""Lab 08, Exercise 3: a sharded checkpoint of one's own, saved on N ranks and loaded for another N.

The student writes ``ShardedCheckpoint(directory)`` with ``save(shards,
shapes)`` and ``load(rank, world_size)``.  Each rank holds rows
[min(r·c, R), min((r + 1)·c, R)) of every tensor of R rows, c = ceil(R / N)
(FSDP2's split: the last ranks get fewer rows, some none).  ``save`` is
called on every rank with that rank's shards and every tensor's full shape;
``load(q, m)`` returns the shards rank q of m ranks would hold, read back from
the files.  The check saves on its N ranks into one fresh directory, then
loads for every rank of other world sizes (one, fewer and more ranks than
saved), and compares with slices of the full tensors.  torch's own answer is
``torch.distributed.checkpoint``, which the notebook uses next.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ... import check
from .. import records as read
from ..harness import Graded, Rule
from ..plain import plain
from .clipping import rows_of


@dataclass(frozen=True)
class CheckpointCase:
    shapes: tuple          # ((name, shape), ...)
    targets: tuple         # world sizes to load for
    seed: int = 3

    def describe(self, n: int) -> str:
        sizes = ", ".join(f"{k} {tuple(s)}" for k, s in self.shapes)
        return (f"tensors {sizes} saved on {n} ranks, loaded for world sizes "
                f"{', '.join(map(str, self.targets))}")

    def full(self) -> dict[str, torch.Tensor]:
        g = torch.Generator().manual_seed(self.seed)
        return {k: torch.randn(*s, generator=g) for k, s in self.shapes}

    def shard(self, t: torch.Tensor, rank: int, n: int) -> torch.Tensor:
        a, b = rows_of(t.shape[0], rank, n)
        return t[a:b]

    def loads(self, rank: int, n: int) -> list[tuple[int, int]]:
        """The (q, m) this rank loads: rank q of every target world size m, spread over the ranks."""
        return [(q, m) for m in self.targets for q in range(m) if q % n == rank]


def slot(q: int, m: int) -> str:
    return f"rank {q} of {m}"


# ---------------------------------------------------------------- on the ranks
def run(cls, case: CheckpointCase, i: int, spy) -> dict:
    import shutil
    import tempfile

    import torch.distributed as dist

    rank, n = dist.get_rank(), dist.get_world_size()
    where = [tempfile.mkdtemp(prefix="parlab-lab08-ckpt-") if rank == 0 else None]
    dist.broadcast_object_list(where, src=0)           # one directory, shared by every rank
    full = case.full()
    shards = {k: case.shard(t, rank, n).clone() for k, t in full.items()}
    shapes = {k: tuple(t.shape) for k, t in full.items()}
    loaded = {}
    try:
        with spy.watch():
            spy.note("save")
            cls(where[0]).save(shards, shapes)
            spy.note("saved")
        dist.barrier()                                  # every rank's files are written
        with spy.watch():
            spy.note("load")
            for q, m in case.loads(rank, n):
                loaded[slot(q, m)] = cls(where[0]).load(q, m)
    finally:
        dist.barrier()
        if rank == 0:
            shutil.rmtree(where[0], ignore_errors=True)
    return {"loaded": plain(loaded)}


def _problem(got, want: dict[str, torch.Tensor]) -> str | None:
    if not isinstance(got, dict):
        return "type"
    for k, w in want.items():
        t = got.get(k)
        if not isinstance(t, torch.Tensor) or t.shape != w.shape:
            return k
        if not bool(check.close_mask(t, w).all()):
            return k
    return None


def settle(result: dict, case: CheckpointCase, i: int, n: int) -> bool:
    import torch.distributed as dist

    full = case.full()
    return all(_problem(result["loaded"].get(slot(q, m)), {k: case.shard(t, q, m) for k, t in full.items()}) is None
               for q, m in case.loads(dist.get_rank(), n))


# ---------------------------------------------------------------- in the grader
def floor_fits(got: torch.Tensor, t: torch.Tensor, a: int, b: int, n: int) -> bool:
    """Whether rows [a, b) of ``got`` are what placing the N saved shards at rank·(R // N) gives.

    Shards placed so overlap (the files may be read in any order), so a row fits when it
    equals a row of any shard placed over it, or is zero where none is.
    """
    step = t.shape[0] // n
    for j in range(a, b):
        sources = [t[r0 + j - r * step] for r in range(n)
                   for r0, r1 in [rows_of(t.shape[0], r, n)] if 0 <= j - r * step < r1 - r0]
        row = got[j - a]
        if not any(bool(check.close_mask(row, s).all()) for s in sources or [torch.zeros_like(row)]):
            return False
    return True


def rank0_only(t: torch.Tensor, n: int) -> torch.Tensor:
    out = torch.zeros_like(t)
    a, b = rows_of(t.shape[0], 0, n)
    out[a:b] = t[a:b]
    return out


def grade(g: Graded) -> str | None:
    for i, case in enumerate(g.cases[:min(len(r) for r in g.results)]):
        full = case.full()
        for r, res in enumerate(g.at(i)):
            for q, m in case.loads(r, g.n):
                want = {k: case.shard(t, q, m) for k, t in full.items()}
                got = res["loaded"].get(slot(q, m))
                k = _problem(got, want)
                if k is not None:
                    return _explain(g, case, full, q, m, got, k, i)
    return None


def _every_load(g: Graded, case: CheckpointCase, i: int, k: str, expect) -> bool:
    """Whether every load of tensor ``k`` on every rank returned ``expect(q, m)`` (None: skip that load)."""
    for r, res in enumerate(g.at(i)):
        for q, m in case.loads(r, g.n):
            want = expect(q, m)
            t = (res["loaded"].get(slot(q, m)) or {}).get(k) if isinstance(res["loaded"].get(slot(q, m)), dict) else None
            if want is not None and not (isinstance(t, torch.Tensor) and t.shape == want.shape
                                         and bool(check.close_mask(t, want).all())):
                return False
    return True


def _floor_split(t: torch.Tensor, q: int, m: int) -> torch.Tensor:
    each = t.shape[0] // m
    return t[q * each:(t.shape[0] if q == m - 1 else (q + 1) * each)]


def _explain(g: Graded, case: CheckpointCase, full: dict, q: int, m: int, got, k: str, i: int) -> str:
    head = f"{g.name} is wrong for {case.describe(g.n)}: load({q}, {m})"
    if k == "type":
        return f"{head} returned {plain(got, tensors=None, other='name')!r}; return a dict {{name: tensor}}."
    t, want = got.get(k), case.shard(full[k], q, m)
    a, b = rows_of(full[k].shape[0], q, m)
    if not isinstance(t, torch.Tensor):
        return f"{head} has no tensor {k!r}; return every saved tensor by name."
    if t.shape != want.shape:
        saved = lambda q2, m2: case.shard(full[k], q2, g.n) if q2 < g.n else None  # noqa: E731
        if m != g.n and _every_load(g, case, i, k, saved):
            return (f"{head} returned the shard rank {q} saved on {g.n} ranks, not resharded: for "
                    f"{m} ranks rank {q} holds rows [{a}, {b}) of {k!r}, {b - a} rows.")
        if _every_load(g, case, i, k, lambda q2, m2: _floor_split(full[k], q2, m2)):
            return (f"{head}: {k!r} has shape {tuple(t.shape)}, expected {tuple(want.shape)}: the rows "
                    f"were split R // M per rank with the remainder on the last rank, but rank {q} of "
                    f"{m} holds rows [{a}, {b}) of its {full[k].shape[0]}, FSDP2's split (ceil(R / N) "
                    "per rank, the last ranks fewer or none).")
        return (f"{head}: {k!r} has shape {tuple(t.shape)}, expected {tuple(want.shape)}: rank {q} of "
                f"{m} holds rows [{a}, {b}) of its {full[k].shape[0]} (ceil(R / N) per rank, the "
                "last ranks fewer or none).")
    rows = full[k].shape[0]
    if rows % g.n and floor_fits(t, full[k], a, b, g.n):
        return (f"{head}: {k!r} holds the saved rows at the wrong places. They sit where "
                f"rank·(R // N) = rank·{rows // g.n} puts them, but with R = {rows} rows on N = {g.n} "
                f"ranks every shard but the last ones holds ceil(R / N) = {-(-rows // g.n)} rows: the "
                "offsets are off by the uneven remainder. Save each shard's first row (its offset) with it.")
    if bool(check.close_mask(t, rank0_only(full[k], g.n)[a:b]).all()):
        return (f"{head}: {k!r} holds only rank 0's saved rows (the others are zero): only rank "
                "0's shard was saved, or only its file read. Every rank saves its own shard, and "
                "load() reads the file of every rank whose rows it needs.")
    bad = int((~check.close_mask(t, want)).flatten().nonzero()[0])
    return (f"{head}: {k!r} differs from rows [{a}, {b}) of the saved tensor, first at element "
            f"{bad}: got {float(t.flatten()[bad]):.6g}, expected {float(want.flatten()[bad]):.6g}.")


def error_hint(text: str) -> str:
    if "No such file" in text or "FileNotFoundError" in text:
        return ("a file that load() reads was never written: every rank saves its own shard, and "
                "load() reads the files of every rank whose rows it needs.")
    return ""


# ---------------------------------------------------------------- the rule
def no_collective(records, case, n) -> str | None:
    for r, rec in enumerate(records):
        for piece, what in ((read.between(rec, "save", "saved"), "save"), (read.between(rec, "load"), "load")):
            if piece["calls"]:
                c = piece["calls"][0]
                return (f"rank {r}'s {what}() called {read.describe(rec, c)}: each rank writes its own "
                        "shard, and a checkpoint is read back on any number of ranks, so neither "
                        "side may wait for the others.")
    return None


RULES = (Rule("`save` and `load` make no `torch.distributed` call: each rank writes its own shard and "
              "where it sits, and `load` reads only the files.", no_collective),)

VISIBLE = ((3, (CheckpointCase(shapes=(("w", (7, 3)), ("b", (5,)), ("e", (2, 4))), targets=(1, 2, 4)),)),)
HIDDEN = ((2, (CheckpointCase(shapes=(("w", (9, 2)), ("b", (1,)), ("x", (3, 2, 2))), targets=(1, 3, 5), seed=4),)),)
