"""Ideal pipeline timetables: GPipe, 1F1B and interleaved 1F1B, simulated.

``schedule_order(p, m, rank, schedule, v)`` is the order in which one stage
runs its forward (F) and backward (B) passes, and ``phases`` cuts that order
into its three named phases: warm-up (forwards only, filling the pipeline),
steady (one forward, one backward) and cool-down (backwards only, draining
it).  ``ideal_schedule`` plays every
stage's order against the data dependencies (a forward needs the previous
stage's forward of the same micro-batch, a backward the next stage's
backward) with fixed durations and no communication cost, and returns the
spans of a perfect run.  Nothing is measured here: these are the timetables
that measured Gantt charts are compared with.

- GPipe (Huang et al. 2019): every forward, then every backward.
- 1F1B, or PipeDream-Flush (Narayanan et al. 2021, "Memory-Efficient
  Pipeline-Parallel DNN Training"): stage r runs min(p − r − 1, m) warm-up
  forwards, then alternates one forward and one backward, then the
  remaining backwards.  Same bubble as GPipe, at most p − r micro-batches'
  activations held instead of m.
- Interleaved 1F1B (Narayanan et al. 2021, "Efficient Large-Scale Language
  Model Training on GPU Clusters using Megatron-LM", §2.2): each rank holds v
  model chunks (virtual stages r, r + p, ..., r + (v−1)p); forwards go
  through the chunks in groups of p micro-batches.  The bubble shrinks by v,
  the point-to-point messages grow by about v.  The order follows
  Megatron-LM's ``forward_backward_pipelining_with_interleaving`` and needs
  m to be a multiple of p.
"""
from __future__ import annotations

from ..cost import pipeline_warmup

__all__ = ["SCHEDULES", "PHASES", "schedule_order", "phases", "ideal_schedule", "peak_held",
           "p2p_messages", "warmup_forwards"]

SCHEDULES = ("gpipe", "1f1b", "interleaved")
PHASES = ("warm-up", "steady", "cool-down")


def _check(p: int, m: int, v: int, schedule: str) -> None:
    if schedule not in SCHEDULES:
        raise ValueError(f"unknown schedule {schedule!r}; allowed: {', '.join(SCHEDULES)}")
    for name, x in (("p", p), ("m", m), ("v", v)):
        if int(x) != x or x < 1:
            raise ValueError(f"{name} must be an integer >= 1, got {x!r}")
    if schedule != "interleaved" and v != 1:
        raise ValueError(f"v={v} only applies to schedule='interleaved'")
    if schedule == "interleaved" and m % p:
        raise ValueError(f"interleaved 1F1B needs m to be a multiple of p: m={m}, p={p}")


def warmup_forwards(p: int, m: int, rank: int, schedule: str = "1f1b", v: int = 1) -> int:
    """Forwards stage ``rank`` runs before the steady one-forward-one-backward phase: the warm-up of
    ``parlab.cost.pipeline_warmup``, capped by the micro-batches (chunk forwards) there are."""
    _check(p, m, v, schedule)
    if schedule == "gpipe":
        return m
    if schedule == "1f1b":
        return min(pipeline_warmup(p, rank), m)
    if m == p:  # Megatron-LM: with as many micro-batches as stages, everything is warm-up
        return m * v
    return min(pipeline_warmup(p, rank, v), m * v)


def _chunk_mb(k: int, p: int, v: int, forward: bool) -> tuple[int, int]:
    """(micro-batch, chunk) of the k-th forward or backward of an interleaved stage."""
    group = (k // p) % v
    chunk = group if forward else v - 1 - group
    return (k // (p * v)) * p + k % p, chunk


def phases(p: int, m: int, rank: int, schedule: str = "1f1b", v: int = 1) -> dict[str, list[tuple]]:
    """Stage ``rank``'s passes cut into its phases, {"warm-up": [...], "steady": [...], "cool-down": [...]}.

    Each pass is ("F" or "B", micro-batch, chunk).  Warm-up: the
    ``warmup_forwards`` forwards that fill the pipeline; steady: alternating
    one forward and one backward, (m·v − warm-up) of each; cool-down: the
    backwards left, as many as the warm-up's forwards.  GPipe is all warm-up
    and cool-down: its m forwards, then its m backwards, no steady phase.
    """
    _check(p, m, v, schedule)
    if not 0 <= rank < p:
        raise ValueError(f"rank must be in 0..{p - 1}, got {rank!r}")
    total = m * v
    w = warmup_forwards(p, m, rank, schedule, v)
    fwd = [("F", *_chunk_mb(k, p, v, True)) for k in range(total)]
    bwd = [("B", *_chunk_mb(k, p, v, False)) for k in range(total)]
    steady = [op for k in range(total - w) for op in (fwd[w + k], bwd[k])]
    return {"warm-up": fwd[:w], "steady": steady, "cool-down": bwd[total - w:]}


def schedule_order(p: int, m: int, rank: int, schedule: str = "1f1b", v: int = 1) -> list[tuple]:
    """Stage ``rank``'s passes in order, as ("F" or "B", micro-batch, chunk): its phases joined."""
    return [op for ops in phases(p, m, rank, schedule, v).values() for op in ops]


def _needs(op: tuple, rank: int, p: int, v: int) -> tuple | None:
    """The (rank, op) that must finish before ``op`` may start on ``rank``."""
    kind, mb, c = op
    if kind == "F":
        if rank > 0:
            return rank - 1, ("F", mb, c)
        return (p - 1, ("F", mb, c - 1)) if c > 0 else None
    if rank < p - 1:
        return rank + 1, ("B", mb, c)
    return (0, ("B", mb, c + 1)) if c < v - 1 else (rank, ("F", mb, c))


def ideal_schedule(p: int, m: int, schedule: str = "1f1b", v: int = 1, forward: float = 1.0,
                   backward: float = 2.0) -> list[dict]:
    """Spans of a perfect pipeline step (no communication time, fixed durations).

    ``forward`` and ``backward`` are the times of one micro-batch through a
    whole stage; with v chunks per rank each chunk takes 1/v of them.  Each
    span is a dict with ``name`` ("F3", or "F3.1" for chunk 1), ``rank``,
    ``start``, ``end``, ``kind`` ("forward"/"backward"), ``mb`` and ``chunk``,
    ready for ``parlab.viz.gantt`` and ``parlab.trace.bubble_fraction``.
    """
    if forward <= 0 or backward <= 0:
        raise ValueError(f"durations must be > 0, got forward={forward!r}, backward={backward!r}")
    orders = [schedule_order(p, m, r, schedule, v) for r in range(p)]
    done: dict[tuple, float] = {}
    free, nxt, spans = [0.0] * p, [0] * p, []
    while any(nxt[r] < len(orders[r]) for r in range(p)):
        progressed = False
        for r in range(p):
            while nxt[r] < len(orders[r]):
                op = orders[r][nxt[r]]
                need = _needs(op, r, p, v)
                if need is not None and need not in done:
                    break
                start = max(free[r], done[need] if need else 0.0)
                end = start + (forward if op[0] == "F" else backward) / v
                done[(r, op)], free[r], nxt[r] = end, end, nxt[r] + 1
                suffix = f".{op[2]}" if schedule == "interleaved" else ""
                spans.append({"name": f"{op[0]}{op[1]}{suffix}", "rank": r, "start": start, "end": end,
                              "kind": "forward" if op[0] == "F" else "backward", "mb": op[1],
                              "chunk": op[2]})
                progressed = True
        if not progressed:  # cannot happen for the schedules above; guards edits to them
            raise RuntimeError(f"the {schedule} order deadlocks for p={p}, m={m}, v={v}")
    return sorted(spans, key=lambda s: (s["start"], s["rank"]))


def peak_held(spans: list[dict], rank: int, v: int = 1) -> float:
    """Most micro-batches' activations ``rank`` holds at once in ``spans``, in whole stages.

    Read from the timetable, not from a formula: a chunk's activations are
    held from the end of its forward to the end of its backward, and each of
    a rank's v chunks holds 1/v of its stage's layers.  On an ideal timetable
    this equals ``cost.activations_held`` (the test shows it).
    """
    events = sorted((s["end"], 1 if s["name"][0] == "F" else -1) for s in spans if s["rank"] == rank)
    held = peak = 0
    for _, delta in events:  # at a tie the backward's release (-1) sorts first
        held += delta
        peak = max(peak, held)
    return peak / v


def p2p_messages(p: int, m: int, v: int = 1) -> int:
    """Point-to-point messages of one step, all ranks together.

    Every boundary between consecutive (virtual) stages that lies between two
    different ranks carries each micro-batch's activation forward and its
    gradient back: 2·m·(p − 1) without interleaving, 2·m·(v·p − 1) with v
    chunks per rank (p = 1: chunk boundaries stay on one rank, 0 messages).
    """
    for name, x in (("p", p), ("m", m), ("v", v)):
        if int(x) != x or x < 1:
            raise ValueError(f"{name} must be an integer >= 1, got {x!r}")
    return 0 if p == 1 else 2 * m * (v * p - 1)
