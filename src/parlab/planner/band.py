"""A band, not a winner: the plans the planner cannot tell apart from its best.

The planner's predictions are off by up to ``planner_published.error_band()`` on published runs
(the largest |predicted ÷ reported − 1| over the runs it covers).  That width is a heuristic, not
a measured resolution: it is the single worst miss over the nine heterogeneous runs it covers (three GPU
generations, four frameworks, dense and MoE), so it says how far the model has been off at worst,
not how far apart two plans on one cluster must be for it to rank them right.  A plan predicted
within that share of the best plan's throughput is one the model cannot be trusted to tell from it:
``band(work)`` returns them all, ranked, each distinct layout once (``layout_key``: the degrees dp,
cp, tp, pp, v, ep and the framework that runs it) at its own best ZeRO stage (and HSDP shard),
micro-batch and recomputation (the simplest among equal predictions, ``planner.simplicity``), so that
no alternative is shown at a setting that handicaps it and no layout is counted twice for a setting that changes
nothing; the same degrees that several frameworks run at the same prediction are one layout, its
notes naming every framework that runs it.  Degrees whose frameworks predict differently (torchtitan's
SP keeps the gathered inputs, Megatron-LM's its slice) stay two layouts.  Among them the
choice rests on what the model leaves out, and ``Choice.notes`` names it for each plan:
  memory margin   the GB left under the usable HBM (fragmentation, communication buffers and
                  the CUDA context are not counted; a small margin risks running out of memory);
  framework       which framework runs it (``planner_frameworks.runs_on``);
  robustness      how many axes' collectives cross nodes (the network is shared with other
                  jobs and congestion between axes is not modelled), and how many pipeline
                  stages (more stages: more to balance, more bubble if micro-batches shrink).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from .. import planner
from . import frameworks, published

__all__ = ["Choice", "Band", "band", "layout_key"]


def layout_key(plan: planner.Plan) -> tuple:
    """The layout of a plan: its degrees (dp, cp, tp, pp, v, ep) and the framework that runs it, without
    the settings that framework chooses among (ZeRO stage and HSDP's shard groups, micro-batch,
    recomputation: with ``Workload(hsdp=True)`` many shards predict alike, and each would otherwise be
    a layout of its own)."""
    return (plan.dp, plan.cp, plan.tp, plan.pp, plan.v, plan.ep, frameworks.runs_on(plan))


@dataclass(frozen=True)
class Choice:
    """One plan of the band: its prediction, its share of the best throughput, and its notes."""

    prediction: planner.Prediction
    share: float  # tokens/s ÷ the best plan's
    notes: dict

    @property
    def plan(self) -> planner.Plan:
        return self.prediction.plan


@dataclass(frozen=True)
class Band:
    """The ranked plans within ``error`` of the best predicted throughput (best first)."""

    error: float
    choices: tuple

    @property
    def best(self) -> Choice:
        return self.choices[0]

    def find(self, **fields) -> Choice | None:
        """The first choice whose plan has these field values (e.g. ``tp=8, pp=1``), or None."""
        for c in self.choices:
            if all(getattr(c.plan, k) == v for k, v in fields.items()):
                return c
        return None

    def __str__(self) -> str:
        rows = [f"{len(self.choices)} plans within {self.error:.0%} of the best (the planner's error on "
                "published runs): the model cannot tell them apart"]
        for c in self.choices:
            rows.append(f"  {c.share:5.3f}  {c.plan}  ({', '.join(f'{k}: {v}' for k, v in c.notes.items())})")
        return "\n".join(rows)


def _crossing_axes(plan: planner.Plan, c: planner.Cluster) -> int:
    axes = [planner.axis_crosses(plan, c, axis) for axis in ("tp", "cp", "dp")]
    return sum(axes) + any(planner.boundary_crosses(plan, c))


def _margin(pred: planner.Prediction, c: planner.Cluster) -> str:
    return f"{(c.usable_memory - sum(pred.memory.values())) / 1e9:.1f} GB"


def _notes(pred: planner.Prediction, work: planner.Workload, runs: list) -> dict:
    """The choice's notes; where several frameworks run its degrees at its prediction, each with its own
    best setting and margin ("Megatron-LM: ZeRO-1, 0.9 GB left; DeepSpeed: ZeRO-2, 5.5 GB left")."""
    plan, c = pred.plan, work.cluster
    framework = runs[0][0] if len(runs) == 1 else "; ".join(
        f"{name}: ZeRO-{p.plan.zero}, {_margin(p, c)} left" for name, p in runs)
    return {"margin": _margin(pred, c), "framework": framework,
            "axes across nodes": str(_crossing_axes(plan, c)), "stages": str(plan.pp)}


def band(work: planner.Workload, error: float | None = None) -> Band | None:
    """The plans predicted within ``error`` (default: the planner's measured error band) of the best,
    each layout at its own best micro-batch and recomputation; None when nothing fits."""
    error = published.error_band() if error is None else error
    if not 0 <= error < 1:
        raise ValueError(f"error must be in [0, 1), got {error!r}")
    fastest: dict[tuple, planner.Prediction] = {}
    for plan in planner.candidates(work):
        if sum(planner.memory_breakdown(plan, work.model).values()) > work.cluster.usable_memory:
            continue
        if planner.problems(plan, work):
            continue
        pred = planner.predict(plan, work)
        key = layout_key(plan)
        if key not in fastest or pred.tokens_per_second > fastest[key].tokens_per_second * (1 + 1e-12) or (
                math.isclose(pred.tokens_per_second, fastest[key].tokens_per_second, rel_tol=1e-12)
                and planner.simplicity(plan) < planner.simplicity(fastest[key].plan)):
            fastest[key] = pred
    if not fastest:
        return None
    ranked, runs = _one_per_shape(fastest)
    top = ranked[0].tokens_per_second
    inside = [p for p in ranked if p.tokens_per_second >= top * (1 - error)]
    return Band(error, tuple(Choice(p, p.tokens_per_second / top, _notes(p, work, runs[id(p)])) for p in inside))


def _one_per_shape(fastest: dict) -> tuple[list, dict]:
    """The frameworks' best plans, ranked, with one shape (the degrees of ``layout_key``) kept once
    where several frameworks predict it the same (Megatron-LM's ZeRO-1, DeepSpeed's ZeRO-2 and
    torchtitan's FSDP of dp 8 when DP hides behind backward): the simplest plan, and ``{id: [(framework,
    its own best plan's prediction)]}`` for every framework that runs it at that prediction."""
    kept: list[planner.Prediction] = []
    runs: dict[int, list[tuple[str, planner.Prediction]]] = {}
    for key, pred in sorted(fastest.items(), key=lambda kv: (-kv[1].tokens_per_second, planner.simplicity(kv[1].plan))):
        twin = next((k for k in kept if layout_key(k.plan)[:-1] == key[:-1]
                     and math.isclose(k.tokens_per_second, pred.tokens_per_second, rel_tol=1e-9)), None)
        if twin is None:
            kept.append(pred)
            runs[id(pred)] = [(key[-1], pred)]
        elif key[-1] not in (f for f, _ in runs[id(twin)]):
            runs[id(twin)].append((key[-1], pred))
    return kept, runs
