"""Lab 04, exercise 4: the bubble measured from traced spans, its cases and its grader.

The student's ``measured_bubble(spans)`` gets ``parlab.trace.Span``s (name,
rank, start, end) of one pipeline step and returns the idle share, the mean
over stages.  The cases are ideal timetables from
``parlab.parallel.pp_schedule.ideal_schedule``, some with send/recv spans,
jitter, waits outside the step, or overlapping spans; the reference is
``parlab.trace.bubble_fraction``.  Hints name the usual wrong ways to measure
it (``_alternatives``).
"""
from __future__ import annotations

import random

from ...parallel.pp_schedule import ideal_schedule
from ..harness import Graded
from ..numbers import numbers_message, shown
from ..plain import NUMBERS, plain


def _spans(p: int, m: int, schedule: str, v: int = 1, forward: float = 1.0, backward: float = 2.0,
           comm: float = 0.0, jitter: float = 0.0, seed: int = 0, edges: float = 0.0) -> tuple:
    """A span set as plain dicts: an ideal timetable, optionally with send/recv spans and jitter.

    ``edges`` adds a recv span of that length on stage 0 before the first forward (waiting for
    the batch) and a send span on the last stage after the last backward, so that a window taken
    over spans of any kind is longer than the compute's.
    """
    rng = random.Random(seed)
    out = []
    if edges:
        out.append({"name": "recv", "rank": 0, "start": -edges, "end": 0.0})
    for sp in ideal_schedule(p, m, schedule, v, forward, backward):
        a = sp["start"] + rng.uniform(0, jitter)
        b = max(a + 0.05, sp["end"] + rng.uniform(-jitter / 2, jitter / 2))
        out.append({"name": sp["kind"], "rank": sp["rank"], "start": a, "end": b})
        if comm and sp["kind"] == "forward" and sp["rank"] < p - 1:
            out.append({"name": "send", "rank": sp["rank"], "start": b, "end": b + comm})
        if comm and sp["kind"] == "forward" and sp["rank"] > 0:
            out.append({"name": "recv", "rank": sp["rank"], "start": max(0.0, a - comm), "end": a})
    if edges:
        end = max(d["end"] for d in out)
        out.append({"name": "send", "rank": p - 1, "start": end, "end": end + edges})
    return tuple(tuple(sorted(d.items())) for d in out)


def _overlapping(seed: int) -> tuple:
    """Two stages whose traced spans overlap (a forward span recorded inside a longer one)."""
    base = [dict(d) for d in _spans(2, 3, "1f1b", seed=seed, jitter=0.3)]
    inner = base[0]
    base.append({"name": "forward", "rank": inner["rank"], "start": inner["start"] + 0.1,
                 "end": inner["start"] + 0.4})
    return tuple(tuple(sorted(d.items())) for d in base)


#: Test sets: ((world size, (span set, ...)),): span sets as tuples of sorted (key, value) pairs.
VISIBLE = ((1, (_spans(4, 4, "gpipe"), _spans(2, 3, "1f1b", comm=0.2, edges=0.5),
                _spans(4, 6, "1f1b", jitter=0.4, seed=1), _overlapping(2))),)
HIDDEN = ((1, (_spans(4, 8, "interleaved", v=2),
               _spans(3, 5, "gpipe", comm=0.1, jitter=0.3, seed=3, edges=0.7),
               _spans(4, 1, "gpipe"), _overlapping(4))),)


def _as_spans(case) -> list:
    from ...trace import Span

    return [Span(d["name"], d["rank"], d["start"], d["end"]) for d in map(dict, case)]


def run(fn, case, i, spy):
    with spy.watch():
        got = fn(_as_spans(case))
    return plain(got, keep=NUMBERS, tensors="number", containers=())


def _alternatives(spans) -> list[tuple[float, str]]:
    """(value, mistake) for the usual wrong ways to measure the bubble."""
    from ... import trace

    busy = ("forward", "backward")
    ranks = sorted({s.rank for s in spans})
    rows = {r: [s for s in spans if s.rank == r and s.name in busy] for r in ranks}
    t0 = min(s.start for s in spans if s.name in busy)
    t1 = max(s.end for s in spans if s.name in busy)
    own = [1 - sum(_union(rows[r])) / (max(s.end for s in rows[r]) - min(s.start for s in rows[r]))
           for r in ranks]
    summed = [1 - sum(s.duration for s in rows[r]) / (t1 - t0) for r in ranks]
    idle = [(t1 - t0) - sum(_union(rows[r])) for r in ranks]
    with_comm = trace.bubble_fraction(spans, busy=("forward", "backward", "send", "recv"),
                                      window=(t0, t1))
    a0, a1 = min(s.start for s in spans), max(s.end for s in spans)
    any_kind = trace.bubble_fraction(spans, window=(a0, a1)) if (a0, a1) != (t0, t1) else None
    return [(sum(own) / len(own), "Each stage's idle share must be measured over the SAME window, "
             "from the first stage's first forward to the last backward on any stage, not over "
             "that stage's own first and last span."),
            (any_kind, "The window runs from the first forward to the last backward, over the "
             "compute spans only: a recv before the first forward or a send after the last backward "
             "is outside the step being measured, so taking the first and last span of any kind "
             "makes the window too long."),
            (with_comm, "Only forward and backward spans count as busy: time in send and recv is "
             "idle (waiting), the very bubble being measured."),
            (sum(summed) / len(summed), "Spans of one stage can overlap: take the union of its "
             "busy intervals, not the sum of their lengths."),
            (sum(idle) / sum((t1 - t0) - i for i in idle), "That is idle time divided by busy time "
             "(Megatron's ratio); this exercise asks for idle time as a share of the step."),
            (max(1 - sum(_union(rows[r])) / (t1 - t0) for r in ranks), "That is the largest stage's "
             "idle share: report the mean over stages.")]


def _union(spans) -> list[float]:
    """Lengths of the union of the spans' intervals."""
    out: list[list[float]] = []
    for a, b in sorted((s.start, s.end) for s in spans):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [b - a for a, b in out]


def grade(g: Graded) -> str | None:
    from ... import trace

    rows = []
    for i, case in enumerate(g.cases[:len(g.results[0])]):
        spans = _as_spans(case)
        p = len({s.rank for s in spans})
        got, want = g.results[0][i], trace.bubble_fraction(spans)
        if isinstance(got, dict) and "repr" in got and got.get("type") in ("dict", "list"):
            return (f"{g.name}(spans) for {p} stages returned {shown(got)[0][:80]}; return ONE "
                    "number, the mean over stages of each stage's idle share.")
        rows.append((got, want, f"{g.name}(spans) for {p} stages and {len(spans)} spans", _alternatives(spans)))
    return numbers_message(rows, rtol=1e-6)  # a way of measuring is named only when every case shows it


