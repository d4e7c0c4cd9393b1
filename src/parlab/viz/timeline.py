"""Gantt charts of traced spans: one row per rank, one colour per kind of work, and
the idle share (the bubble) over the compute.
"""
from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from .style import clean_axes, place_legend, new_axes, text_color


_SPAN_COLORS = {
    "forward": "#4e8fd6", "backward": "#f28e2b", "weight_grad": "#f7c08a",
    "optimizer": "#59a14f", "compute": "#9aa5b1", "loss": "#b07aa1",
    "all_reduce": "#d62728", "all_gather": "#8c564b", "reduce_scatter": "#e377c2",
    "broadcast": "#bcbd22", "all_to_all": "#7f7f7f", "send": "#17becf",
    "recv": "#0e6f7a", "barrier": "#404040", "wait": "#c7c7c7",
}


_ALIASES = {
    "f": "forward", "fwd": "forward", "b": "backward", "bwd": "backward", "w": "weight_grad",
    "opt": "optimizer", "optim": "optimizer", "step": "optimizer", "allreduce": "all_reduce",
    "allgather": "all_gather", "reducescatter": "reduce_scatter", "alltoall": "all_to_all",
    "isend": "send", "irecv": "recv",
}


EXTRA_COLORS = ["#76b7b2", "#edc948", "#ff9da7", "#af7aa1", "#9c755f", "#bab0ac"]


def _category(name: str) -> str:
    """'F3' -> 'forward', 'all_reduce bucket 2' -> 'all_reduce', 'fwd[mb=1]' -> 'forward'."""
    base = (re.match(r"[a-z_]*", name.strip().lower()).group(0) or name).strip("_")
    if base in _ALIASES:
        return _ALIASES[base]
    for key in sorted([*_SPAN_COLORS, *(a for a in _ALIASES if len(a) > 1)], key=len, reverse=True):
        if base.startswith(key):
            return _ALIASES.get(key, key)
    return base or name


def _field(span: Any, key: str, default: Any = None) -> Any:
    if isinstance(span, Mapping):
        return span.get(key, default)
    return getattr(span, key, default)


def _read_spans(spans: Sequence[Any]) -> list[tuple[str, int, float, float, int]]:
    out = []
    for i, s in enumerate(spans):
        vals = [_field(s, k) for k in ("name", "rank", "start", "end")]
        if any(v is None for v in vals):
            raise ValueError(f"span {i} ({s!r}) needs name, rank, start and end")
        name, rank, start, end = str(vals[0]), int(vals[1]), float(vals[2]), float(vals[3])
        if end < start or rank < 0:
            raise ValueError(f"span {i} ({name!r}) has rank {rank}, start {start}, end {end}: "
                             "need rank >= 0 and end >= start")
        out.append((name, rank, start, end, int(_field(s, "bytes", 0) or 0)))
    if not out:
        raise ValueError("no spans to draw")
    return out


def _idle_share(rows: dict[int, list[tuple[float, float]]], t0: float, t1: float) -> float:
    """Mean over ranks of 1 - |union of spans| / (t1 - t0): GPipe's 'share of time' bubble.

    Same definition as parlab.trace.bubble_fraction with every span counted as busy.
    """
    shares = []
    for iv in rows.values():
        busy, end = 0.0, t0
        for a, b in sorted(iv):
            a = max(a, end)
            if b > a:
                busy, end = busy + b - a, b
        shares.append(1 - busy / (t1 - t0))
    return sum(shares) / len(shares)


def _time_unit(span: float, unit: str) -> tuple[float, str]:
    if unit == "auto":
        unit = "s" if span >= 1 else "ms" if span >= 1e-3 else "us"
    scales = {"s": 1.0, "ms": 1e3, "us": 1e6, "steps": 1.0}
    if unit not in scales:
        raise ValueError(f"unit must be 'auto', 's', 'ms', 'us' or 'steps', got {unit!r}")
    return scales[unit], {"us": "µs"}.get(unit, unit)


def _human_bytes(x: float) -> str:
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if abs(x) >= size:
            return f"{x / size:.3g} {unit}"
    return f"{x:.0f} B"


_COMM = {"all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce", "send", "recv",
         "all_to_all"}


def _overlaps(iv: tuple[float, float], others: list[tuple[float, float]]) -> bool:
    return any(a < iv[1] and iv[0] < b for a, b in others if (a, b) != iv)


def gantt(spans: Sequence[Any], *, title: str | None = None, show_bubble: bool = False,
          predicted_bubble: float | None = None, unit: str = "auto", labels: bool = True,
          comm_lane: bool | None = None, ax: Axes | None = None) -> Figure:
    """Per-rank timeline of traced spans, coloured by kind of work.

    A span is anything with ``name, rank, start, end`` (and optionally
    ``bytes``) as attributes or dict keys, e.g. ``parlab.trace.Span``.  Time
    runs from the earliest start; hatched grey is idle time (pipeline
    bubbles).  ``show_bubble`` adds the measured idle share of the window
    (GPipe's definition, (p-1)/(m+p-1) for an ideal GPipe step) to the title,
    next to ``predicted_bubble`` if given.  ``unit='steps'`` keeps raw times.

    ``comm_lane`` draws communication (all_reduce, send, ...) in a lane of
    its own under each rank's compute, like a profiler's separate streams, so
    that communication overlapping backward stays visible.  By default it is
    on when some rank's communication overlaps its other work.
    """
    items = _read_spans(spans)
    t0, t1 = min(s[2] for s in items), max(s[3] for s in items)
    scale, unit_name = _time_unit(t1 - t0, unit)
    length = (t1 - t0) * scale or 1.0
    ranks = sorted({s[1] for s in items})
    owns = ax is None
    fig, ax = new_axes(ax, (10, 0.55 * len(ranks) + 2.2))
    colors, extra = dict(_SPAN_COLORS), iter(EXTRA_COLORS * 10)
    used: dict[str, str] = {}
    axes_inches = ax.get_position().width * fig.get_figwidth()
    is_comm = [_category(s[0]) in _COMM for s in items]
    lanes: dict[tuple[int, bool], list[tuple[float, float]]] = {}
    for (_, r, a, b, _), c in zip(items, is_comm):
        lanes.setdefault((r, c), []).append((a, b))
    if comm_lane is None:
        comm_lane = any(_overlaps(iv, lanes.get((r, False), [])) for (r, c), ivs in lanes.items() if c
                        for iv in ivs)
    height = 0.36 if comm_lane else 0.7
    for r in ranks:
        ax.barh(r, length, left=0, height=0.8 if comm_lane else 0.7, facecolor="#f4f4f4",
                edgecolor="#d5d5d5", hatch="////", lw=0)
    for (name, r, a, b, nbytes), c in zip(items, is_comm):
        cat = _category(name)
        color = used.setdefault(cat, colors.get(cat) or next(extra))
        x, w = (a - t0) * scale, (b - a) * scale
        y = r + (0.2 if c else -0.2) if comm_lane else r
        ax.barh(y, w, left=x, height=height, color=color, edgecolor="white", lw=0.6)
        options = [name + f"\n{_human_bytes(nbytes)}", name] if nbytes and not comm_lane else [name]
        fits = [t for t in options  # 8 pt text: about 0.075 inch a character
                if w / length * axes_inches >= 0.075 * max(map(len, t.split("\n"))) + 0.05]
        crowded = _overlaps((a, b), lanes[(r, c)])  # in-flight async ops stack up
        if labels and fits and not crowded:
            ax.text(x + w / 2, y, fits[0], ha="center", va="center", fontsize=8 if not comm_lane else 7,
                    color=text_color(color))
    ax.set_yticks(ranks, [f"rank {r}" for r in ranks])
    ax.set_ylim(max(ranks) + 0.6, min(ranks) - 0.6)
    ax.set_xlim(0, length)
    ax.set_xlabel("time (steps)" if unit == "steps" else f"time ({unit_name})", fontsize=11)
    heading = title or "timeline per rank"
    if show_bubble or predicted_bubble is not None:
        rows: dict[int, list] = {}
        for _, r, a, b, _ in items:
            rows.setdefault(r, []).append((a, b))
        note = f"idle share (bubble) in these spans {_idle_share(rows, t0, t1):.1%}"
        if predicted_bubble is not None:
            note += f", predicted {predicted_bubble:.1%}"
        heading += "\n" + note
    ax.set_title(heading, fontsize=12)
    clean_axes(ax)
    handles = [Patch(color=c, label=k) for k, c in used.items()]
    handles.append(Patch(facecolor="#f4f4f4", edgecolor="#d5d5d5", hatch="////", label="idle"))
    place_legend(fig, ax, handles, owns, ncol=min(len(handles), 7))
    return fig
