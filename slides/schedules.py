"""Ideal pipeline schedules: each stage runs its list of forwards and backwards in order,
each as soon as its input is ready.  Computed, not measured (lab 04 will measure them).

    orders = stage_orders("1f1b", p=4, m=8)
    spans = simulate(orders, fwd=1.0, bwd=2.0)   # dicts that parlab.viz.gantt draws

The dependencies are those of a pipeline: F(stage r, micro-batch i) needs F(r−1, i);
B(r, i) needs B(r+1, i), and the last stage's B(i) needs its own F(i).
"""
from __future__ import annotations

SCHEDULES = ("gpipe", "1f1b")


def stage_orders(schedule: str, p: int, m: int) -> list[list[tuple[str, int]]]:
    """The (kind, micro-batch) sequence of every stage.

    gpipe: all m forwards, then all m backwards (Huang et al., 2019).
    1f1b:  p − r − 1 warm-up forwards on stage r, then one forward and one
           backward alternating, then the remaining backwards (Narayanan et
           al., 2021; the warm-up count of Megatron-LM's schedules).
    """
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule must be one of {SCHEDULES}, got {schedule!r}")
    if p < 1 or m < 1:
        raise ValueError(f"need p >= 1 stages and m >= 1 micro-batches, got p={p}, m={m}")
    orders = []
    for r in range(p):
        if schedule == "gpipe":
            orders.append([("F", i) for i in range(m)] + [("B", i) for i in range(m)])
            continue
        warm = min(p - r - 1, m)
        order = [("F", i) for i in range(warm)]
        for i in range(m - warm):
            order += [("F", warm + i), ("B", i)]
        order += [("B", i) for i in range(m - warm, m)]
        orders.append(order)
    return orders


def simulate(orders: list[list[tuple[str, int]]], fwd: float = 1.0, bwd: float = 2.0) -> list[dict]:
    """Start and end of every operation when each runs as early as its stage and inputs allow."""
    p = len(orders)
    end: dict[tuple[str, int, int], float] = {}
    free = [0.0] * p
    nxt = [0] * p
    spans = []
    while any(nxt[r] < len(orders[r]) for r in range(p)):
        progressed = False
        for r in range(p):
            if nxt[r] >= len(orders[r]):
                continue
            kind, i = orders[r][nxt[r]]
            dep = ("F", r - 1, i) if kind == "F" else ("B", r + 1, i) if r < p - 1 else ("F", r, i)
            if kind == "F" and r == 0:
                ready = 0.0
            elif dep in end:
                ready = end[dep]
            else:
                continue
            start = max(free[r], ready)
            free[r] = end[(kind, r, i)] = start + (fwd if kind == "F" else bwd)
            spans.append({"name": f"{kind}{i}", "rank": r, "start": start, "end": free[r]})
            nxt[r] += 1
            progressed = True
        if not progressed:
            raise ValueError("these stage orders deadlock: every stage waits for another")
    return spans


def peak_in_flight(spans: list[dict], stage: int) -> int:
    """Most micro-batches whose forward has run on ``stage`` and whose backward has not ended."""
    events = sorted((s["end"], 1 if s["name"][0] == "F" else -1) for s in spans if s["rank"] == stage)
    held = peak = 0
    for _, delta in events:
        held += delta
        peak = max(peak, held)
    return peak
