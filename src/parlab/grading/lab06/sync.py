"""Lab 06, section 3: ``sync_dp_grads(model, dp_group)``, the DP half of 2-D (DP × TP) training.

On a dp × tp mesh (TP innermost) the ranks of one TP group hold different
shards of the model, and the ranks of one DP group hold the same shard and
train it on different rows of the batch.  The check makes that visible
without any tensor-parallel layer: TP rank t holds its own copy of parlab's
GPT built from seed t (a stand-in for "its shard": different numbers on each
TP rank), and DP replica d trains it on its rows of each global batch.  After
``sync_dp_grads`` and an SGD step, every rank must hold what one process gets
by training model t on the whole batch (``parlab.reference.reference_steps``).

Averaging over the whole world instead mixes the TP ranks' different models;
summing without dividing makes the step dp times too large.  Each known
mistake is named only when every rank's first update is what it gives and
no other's (``diagnosis.diagnose``); the ranks come from a
``parallel.mesh.Grid``.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from ... import check
from ...parallel.mesh import Grid
from ..diagnosis import diagnose, hint
from ..harness import Exercise, Graded, Rule
from ..records import events
from .subgroups import watching

CFG = dict(n_layer=1, d_model=16, n_head=2, seq_len=8)
LR = 0.1
SEED = 5


@dataclass(frozen=True)
class SyncCase:
    """``steps`` SGD steps on a dp × tp mesh, ``rows`` rows of each global batch per DP replica."""

    dp: int
    tp: int
    steps: int = 2
    rows: int = 2

    def describe(self, n: int) -> str:
        return (f"a dp={self.dp} × tp={self.tp} mesh (TP rank t holds parlab's GPT built from seed t, "
                f"DP replica d trains it on its {self.rows} rows of each batch of {self.rows * self.dp}), "
                f"{self.steps} SGD steps, world_size {n}")


def _model(t: int):
    from ...models import tiny_gpt

    return tiny_gpt(seed=t, **CFG)


def _flat(params) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1).cpu() for p in params])


@functools.lru_cache(maxsize=32)
def reference(t: int, case: SyncCase) -> tuple[torch.Tensor, ...]:
    """Flat parameters of model t before and after each step of one process on the whole batch."""
    from ...reference import reference_steps

    ref = reference_steps(lambda: _model(t), steps=case.steps, batch_size=case.rows * case.dp,
                          seq_len=CFG["seq_len"], seed=SEED, lr=LR)
    return (_flat(ref.initial.values()),) + tuple(_flat(p.values()) for p in ref.params)


@functools.lru_cache(maxsize=64)
def _first_grad(t: int, d: int, case: SyncCase) -> torch.Tensor:
    """The flat gradient of model t on replica d's rows of the first batch, in one process."""
    from ...data import get_batch
    from ...models import lm_loss

    model = _model(t)
    x, y = get_batch(0, case.rows * case.dp, CFG["seq_len"], SEED)
    rows = slice(d * case.rows, (d + 1) * case.rows)
    lm_loss(model, x[rows], y[rows]).backward()
    return _flat(p.grad for p in model.parameters())


# ---------------------------------------------------------------- on the ranks
def _run(fn, case: SyncCase, i, spy) -> dict:
    import torch.distributed as dist

    from ...data import get_batch
    from ...models import lm_loss
    from ...launch.runtime import device

    rank = dist.get_rank()
    grid = _grid(case)
    d, t = grid.coords(rank)["dp"], grid.coords(rank)["tp"]
    groups = [dist.new_group(ranks) for ranks in grid.groups("dp")]  # groups[t]: the DP group of shard t
    model = _model(t).to(device())
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    flats = [_flat(model.parameters())]
    for s in range(case.steps):
        x, y = get_batch(s, case.rows * case.dp, CFG["seq_len"], SEED)
        rows = slice(d * case.rows, (d + 1) * case.rows)  # x[rows], y[rows]: (rows, seq_len), replica d's share
        model.zero_grad(set_to_none=True)
        lm_loss(model, x[rows].to(device()), y[rows].to(device())).backward()
        with watching(spy):
            fn(model, groups[t])
        opt.step()
        flats.append(_flat(model.parameters()))
    return {"flats": flats}


# ---------------------------------------------------------------- grading
def _close(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and bool(check.close_mask(a, b).all())


def _grid(case: SyncCase) -> Grid:
    """The case's ranks: dp replicas of tp shards, tp varying fastest (``rank = d·tp + t``)."""
    return Grid.of(dp=case.dp, tp=case.tp)


def _grade(g: Graded) -> str | None:
    for i, case in enumerate(g.cases[:min(len(r) for r in g.results)]):
        grid = _grid(case)
        for r, res in enumerate(g.at(i)):
            d, t = grid.coords(r)["dp"], grid.coords(r)["tp"]
            ref = reference(t, case)
            for s, (got, want) in enumerate(zip(res["flats"], ref)):
                if _close(got, want):
                    continue
                where = (f"{g.name} is wrong for {case.describe(g.n)}: on rank {r} (d={d}, t={t}) the "
                         f"parameters after step {s} differ from one process training model {t} on the "
                         "whole batch.")
                return where + (hint(_why(g.at(i), case, g.n), " ") if s == 1 else "")
    return None


def _why(results: list, case: SyncCase, n: int) -> str:
    """The mistake whose first update every rank shows (``diagnosis.diagnose``), or ""."""
    grid, pieces, right = _grid(case), [], []
    for r, res in enumerate(results):
        d, t = grid.coords(r)["dp"], grid.coords(r)["tp"]
        init, got = res["flats"][0], res["flats"][1]
        mean = sum(_first_grad(t, k, case) for k in range(case.dp)) / case.dp
        world = sum(_first_grad(j, k, case) for j in range(case.tp) for k in range(case.dp)) / n
        signatures = {
            "world": (case.tp > 1, init - LR * world,
                      "The gradients were averaged over the whole world: the ranks of a TP group hold "
                      "different shards (here, different models), so a world all-reduce adds unrelated "
                      "numbers. Average over dp_group only (group=dp_group)."),
            "own": (case.dp > 1, init - LR * _first_grad(t, d, case),
                    "The step used this replica's own gradient: the gradients were not averaged over dp_group."),
            "summed": (case.dp > 1, init - LR * case.dp * mean,
                       "The update is dp times too large: the gradients were summed over dp_group but "
                       "not divided by its size."),
            "by world": (case.tp > 1, init - LR * mean / case.tp,
                         "The update is 1/tp of the right one: divided by the world size, not by the size "
                         "of dp_group (dist.get_world_size(dp_group))."),
        }
        fits = {name: words for name, (possible, update, words) in signatures.items()
                if possible and _close(got, update)}
        if _close(got, reference(t, case)[1]):
            right.append([name for name, (possible, _, _) in signatures.items() if possible])
        else:
            pieces.append(fits)
    return diagnose(pieces, right)


def only_dp_group(records, case, n):
    grid = _grid(case)
    for r, rec in enumerate(records):
        want = grid.group_of(r, "dp")
        for c in events(rec, "collective"):
            if c["ranks"] != want:
                world = " (the whole world)" if c["ranks"] == list(range(n)) else ""
                return (f"rank {r} called dist.{c['op']} over ranks {c['ranks']}{world}; its DP group is "
                        f"{want}.")
    return None


def error_hint(text: str) -> str:
    if "AVG" in text or "ReduceOp" in text:
        return ("if this backend refuses ReduceOp.AVG (older gloo builds do), all-reduce with SUM, "
                "then divide by the group's size.")
    return ""


_VISIBLE = ((4, (SyncCase(2, 2), SyncCase(4, 1), SyncCase(1, 4))),)
_HIDDEN = ((2, (SyncCase(2, 1, steps=3, rows=3), SyncCase(1, 2))),)

SYNC = Exercise(key="lab06.sync", answer="sync_dp_grads", run=_run, grade=_grade,
                visible=_VISIBLE, hidden=_HIDDEN, timeout=90,
                rules=(Rule("Communicate only over `dp_group`: every collective is on `dp_group`, "
                            "none on the whole world.", only_dp_group),),
                on_hang="every rank of dp_group must make the same collectives in the same order.",
                on_error=error_hint)
