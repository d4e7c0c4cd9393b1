"""Figures for the labs and slides: collectives, Gantt charts, memory, bandwidth, mesh,
and lab 00's memory and time-to-train arithmetic.

It is one module, longer than most in parlab, on purpose: every figure shares
the palette, the legend placement and the unit helpers below, and a reader
looking for "the figure of X" finds all of them in one place, one section each.

Every function returns a ``matplotlib.figure.Figure``.  The figure is closed
in pyplot before it is returned, so a notebook shows it once when it is the
cell's last expression, and a loop that makes many figures leaks nothing.
Pass ``ax=`` to draw into an axes of your own figure instead.

One palette throughout: rank r is always ``rank_color(r)`` (matplotlib's
tab10), and a kind of work (forward, backward, all_reduce, ...) is always the
same colour in every Gantt chart.
"""
from __future__ import annotations

import math
import re
import textwrap
from collections.abc import Mapping, Sequence
from typing import Any

import matplotlib
from matplotlib.axes import Axes
from matplotlib.colors import to_rgb
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import FancyBboxPatch, Patch, Rectangle
from matplotlib.ticker import FixedLocator, FuncFormatter

from . import cost
from .cost import busbw_factor

__all__ = ["rank_color", "collective_diagram", "gantt", "memory_bars", "training_memory_bars",
           "time_to_train_curves", "bandwidth_curves", "mesh_picture"]

_TAB10 = matplotlib.colormaps["tab10"].colors
_SUM_COLOR = "#2f3e4e"  # reduced (Σ) chunks
_EMPTY_EDGE = "#b0b0b0"


def rank_color(rank: int) -> tuple[float, float, float]:
    """The colour of ``rank`` in every parlab figure."""
    return _TAB10[rank % 10]


def _new_axes(ax: Axes | None, size: tuple[float, float]) -> tuple[Figure, Axes]:
    if ax is not None:
        return ax.figure, ax
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=size, layout="constrained")
    plt.close(fig)  # returned, not auto-shown: no double display, no leak
    return fig, ax


def _text_color(face) -> str:
    r, g, b = to_rgb(face)
    return "white" if 0.299 * r + 0.587 * g + 0.114 * b < 0.55 else "black"


def _clean(ax: Axes) -> None:
    ax.spines[["top", "right"]].set_visible(False)
    ax.tick_params(labelsize=10)


def _legend(fig: Figure, ax: Axes, handles, owns_figure: bool, ncol: int) -> None:
    if owns_figure:  # below the plot, laid out by constrained layout: never over data
        fig.legend(handles=handles, loc="outside lower center", ncol=ncol, frameon=False,
                   fontsize=9)
    else:
        ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1), frameon=False,
                  fontsize=9)


# ---------------------------------------------------------------- collectives

_LETTERS = "abcdefgh"
_CAPTIONS = {
    "broadcast": "broadcast (root 0): every rank ends with a copy of rank 0's buffer.",
    "reduce": "reduce (root 0): rank 0 gets the element-wise sum, Σj = {sum}; the other "
              "buffers are not part of the result (faded).",
    "all_reduce": "all_reduce: every rank gets the element-wise sum, Σj = {sum}.",
    "all_gather": "all_gather: every rank gets every rank's chunk, in rank order.",
    "reduce_scatter": "reduce_scatter: rank r gets chunk r of the sum, Σr = {sum_r}.",
    "barrier": "barrier: no rank leaves until the last one arrives.",
}
COLLECTIVE_OPS = tuple(_CAPTIONS)


def _cells(op: str, n: int, after: bool):
    """(label, owner, faded) or None for each (rank, chunk); owner -1 means a sum."""
    def data(r, j):
        return f"{_LETTERS[r]}{j}", r, False

    def total(j):
        return f"Σ{j}", -1, False

    grid = [[None] * n for _ in range(n)]
    for r in range(n):
        for j in range(n):
            if not after:
                if op == "broadcast":
                    grid[r][j] = data(0, j) if r == 0 else None
                elif op == "all_gather":
                    grid[r][j] = data(r, j) if j == r else None
                else:  # reduce, all_reduce, reduce_scatter: full buffers
                    grid[r][j] = data(r, j)
            elif op == "broadcast":
                grid[r][j] = data(0, j)
            elif op == "reduce":
                grid[r][j] = total(j) if r == 0 else (f"{_LETTERS[r]}{j}", r, True)
            elif op == "all_reduce":
                grid[r][j] = total(j)
            elif op == "all_gather":
                grid[r][j] = data(j, j)
            elif op == "reduce_scatter":
                grid[r][j] = total(j) if j == r else None
    return grid


def _draw_grid(ax: Axes, grid, x0: float, n: int) -> None:
    for r in range(n):
        for j in range(n):
            cell = grid[r][j]
            if cell is None:
                ax.add_patch(Rectangle((x0 + j + 0.05, r + 0.1), 0.9, 0.8, fill=False,
                                       edgecolor=_EMPTY_EDGE, linestyle=(0, (3, 2)), lw=1))
                continue
            label, owner, faded = cell
            face = _SUM_COLOR if owner < 0 else rank_color(owner)
            ax.add_patch(Rectangle((x0 + j + 0.05, r + 0.1), 0.9, 0.8, facecolor=face,
                                   edgecolor="white", alpha=0.3 if faded else 1.0))
            ax.text(x0 + j + 0.5, r + 0.5, label, ha="center", va="center", fontsize=11,
                    color="black" if faded else _text_color(face), fontweight="bold")


def _barrier(ax: Axes, n: int) -> None:
    arrive = [1.0 + 1.6 * ((r * 5 + 2) % n) / max(n - 1, 1) for r in range(n)]
    release = max(arrive) + 0.15
    for r in range(n):
        ax.barh(r, arrive[r], left=0, height=0.6, color=rank_color(r))
        ax.barh(r, release - arrive[r], left=arrive[r], height=0.6, facecolor="#eeeeee",
                edgecolor="#999999", hatch="///", lw=0.5)
        ax.barh(r, 0.8, left=release, height=0.6, color=rank_color(r))
    ax.axvline(release, color="black", ls="--", lw=1.2)
    ax.text(release, -0.55, "last rank arrives:\nall ranks continue", ha="center",
            va="bottom", fontsize=9)
    ax.set_yticks(range(n), [f"rank {r}" for r in range(n)])
    ax.set_ylim(n - 0.5, -1.3)
    ax.set_xlim(0, release + 0.9)
    ax.set_xticks([])
    ax.set_xlabel("time →", fontsize=11)
    ax.legend(handles=[Patch(color=rank_color(0), label="working (colour = rank)"),
                       Patch(facecolor="#eeeeee", edgecolor="#999999", hatch="///",
                             label="waiting in barrier()")],
              loc="upper left", fontsize=9, frameon=False, ncol=2)
    _clean(ax)


def collective_diagram(op: str, n: int = 4, *, ax: Axes | None = None) -> Figure:
    """Who holds which chunk before and after a collective on ``n`` ranks.

    Ranks are rows.  Rank r's data is the letter a, b, c, ... and chunk j of it
    is e.g. ``b2``; ``Σj`` is the element-wise sum of chunk j over all ranks.
    ``op`` is one of broadcast, reduce, all_reduce, all_gather,
    reduce_scatter or barrier (a timeline instead of chunks).
    """
    key = op.lower().replace("-", "_").replace(" ", "_")
    if key not in _CAPTIONS:
        raise ValueError(f"unknown op {op!r}; choose one of {', '.join(COLLECTIVE_OPS)}")
    if not isinstance(n, int) or not 2 <= n <= len(_LETTERS):
        raise ValueError(f"n must be an int from 2 to {len(_LETTERS)} (one letter per rank), got {n!r}")
    width = max(6.5, 1.25 * n + 3.5)
    fig, ax = _new_axes(ax, (width, 0.62 * n + 2.1))
    sum_terms = " + ".join(f"{_LETTERS[r]}j" for r in range(n))
    caption = _CAPTIONS[key].format(sum=sum_terms, sum_r=sum_terms.replace("j", "r"))
    ax.set_title(f"{key}  (n = {n} ranks)", fontsize=13, fontweight="bold")
    if key == "barrier":
        _barrier(ax, n)
        ax.text(0, n + 0.1, textwrap.fill(caption, int(width * 11)), fontsize=10, va="top")
        return fig
    gap = 1.6
    _draw_grid(ax, _cells(key, n, after=False), 0, n)
    _draw_grid(ax, _cells(key, n, after=True), n + gap, n)
    for r in range(n):
        ax.text(-0.15, r + 0.5, f"rank {r}", ha="right", va="center", fontsize=10,
                color=rank_color(r), fontweight="bold")
    ax.text(n / 2, -0.2, "before", ha="center", va="bottom", fontsize=11)
    ax.text(n + gap + n / 2, -0.2, "after", ha="center", va="bottom", fontsize=11)
    ax.annotate("", xy=(n + gap - 0.2, n / 2), xytext=(n + 0.2, n / 2),
                arrowprops=dict(arrowstyle="-|>", lw=2, color="black", mutation_scale=18))
    lines = textwrap.wrap(caption, int(width * 11))
    ax.text(-1.3, n + 0.3, "\n".join(lines), fontsize=10, va="top", ha="left")
    ax.set_xlim(-1.4, 2 * n + gap + 0.1)
    ax.set_ylim(n + 0.45 + 0.42 * len(lines), -0.75)
    ax.set_aspect("equal")
    ax.axis("off")
    return fig


# ---------------------------------------------------------------- Gantt chart

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
_EXTRA_COLORS = ["#76b7b2", "#edc948", "#ff9da7", "#af7aa1", "#9c755f", "#bab0ac"]


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
    fig, ax = _new_axes(ax, (10, 0.55 * len(ranks) + 2.2))
    colors, extra = dict(_SPAN_COLORS), iter(_EXTRA_COLORS * 10)
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
                    color=_text_color(color))
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
    _clean(ax)
    handles = [Patch(color=c, label=k) for k, c in used.items()]
    handles.append(Patch(facecolor="#f4f4f4", edgecolor="#d5d5d5", hatch="////", label="idle"))
    _legend(fig, ax, handles, owns, ncol=min(len(handles), 7))
    return fig


# ---------------------------------------------------------------- memory

_MEM_ORDER = ["params", "grads", "optimizer", "activations"]
_MEM_COLORS = {"params": "#4e79a7", "grads": "#f28e2b", "optimizer": "#59a14f",
               "activations": "#b07aa1", "other": "#9aa5b1"}


def _byte_unit(x: float) -> tuple[float, str]:
    """Decimal units, as GPU datasheets and the ZeRO paper count (140 GB = 140e9 bytes)."""
    for name, size in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if x >= size:
            return size, name
    return 1.0, "bytes"


def _check_memory(name: str, table: Mapping) -> None:
    if not isinstance(table, Mapping) or not table:
        raise ValueError(f"{name} must be a non-empty dict of label -> {{category: bytes}}")
    for label, cats in table.items():
        if not isinstance(cats, Mapping) or not cats:
            raise ValueError(f"{name}[{label!r}] must be a non-empty dict of category -> bytes")
        for cat, v in cats.items():
            if not isinstance(v, (int, float)) or v < 0 or math.isnan(v):
                raise ValueError(f"{name}[{label!r}][{cat!r}] = {v!r}: bytes must be >= 0")


def memory_bars(measured: Mapping[Any, Mapping[str, float]],
                predicted: Mapping[Any, Mapping[str, float]] | Mapping[str, float] | None = None,
                *, title: str | None = None, ax: Axes | None = None) -> Figure:
    """Stacked memory bars per rank: measured (solid) beside predicted (hatched).

    ``measured`` maps a rank or label to ``{category: bytes}`` (params, grads,
    optimizer, activations, or anything else).  ``predicted`` has the same
    labels, or is a single ``{category: bytes}`` that applies to every rank.
    """
    _check_memory("measured", measured)
    if predicted is not None and predicted and all(isinstance(v, (int, float)) for v in predicted.values()):
        predicted = {label: predicted for label in measured}
    if predicted is not None:
        _check_memory("predicted", predicted)
        if set(predicted) != set(measured):
            raise ValueError(f"predicted labels {sorted(map(str, predicted))} differ from "
                             f"measured labels {sorted(map(str, measured))}")
    tables = [measured] + ([predicted] if predicted else [])
    cats = [c for c in _MEM_ORDER if any(c in t[k] for t in tables for k in t)]
    cats += [c for t in tables for k in t for c in t[k] if c not in cats]
    cats = list(dict.fromkeys(cats))
    extra = iter(_EXTRA_COLORS * 10)
    colors = {c: _MEM_COLORS.get(c) or next(extra) for c in cats}
    size, unit = _byte_unit(max(sum(t[k].values()) for t in tables for k in t))
    labels = list(measured)
    owns = ax is None
    fig, ax = _new_axes(ax, (max(6.0, 1.3 * len(labels) + 3), 4.6))
    width = 0.38 if predicted else 0.6
    for i, label in enumerate(labels):
        for table, dx, hatch in ((measured, -width / 2, None), (predicted, width / 2, "//")):
            if not table:
                continue
            x, bottom = i + (dx if predicted else 0), 0.0
            for c in cats:
                v = table[label].get(c, 0) / size
                ax.bar(x, v, width, bottom=bottom, color=colors[c], hatch=hatch,
                       edgecolor="white", alpha=0.6 if hatch else 1.0, lw=0.8)
                bottom += v
            ax.text(x, bottom, f"{bottom:.3g}", ha="center", va="bottom", fontsize=8)
    ax.set_xticks(range(len(labels)), [f"rank {k}" if isinstance(k, int) else str(k) for k in labels])
    ax.set_ylabel(f"memory ({unit})", fontsize=11)
    ax.margins(y=0.12)
    ax.set_title(title or ("memory per rank: measured vs predicted" if predicted else "memory per rank"),
                 fontsize=12)
    _clean(ax)
    handles = [Patch(color=colors[c], label=c) for c in cats]
    if predicted:
        handles += [Patch(facecolor="#999999", label="measured"),
                    Patch(facecolor="#999999", alpha=0.6, hatch="//", edgecolor="white",
                          label="predicted")]
    _legend(fig, ax, handles, owns, ncol=min(len(handles), 6))
    return fig


# ---------------------------------------------------------------- why one GPU is not enough (lab 00)

def _positive(name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0 or math.isinf(value):
        raise ValueError(f"{name} must be a positive number, got {value!r}")
    return float(value)


def _plain(x: float) -> str:
    """1120 -> '1,120', 112 -> '112', 0.5 -> '0.5': no scientific notation on axes and labels."""
    return f"{x:,.0f}" if x >= 100 else f"{x:.3g}"


def training_memory_bars(models: Mapping[str, float], *, gpu_memory: float = cost.H100_MEMORY,
                         weight_bytes: float = 2, grad_bytes: float = 2, optim_bytes: float = 12,
                         title: str | None = None, ax: Axes | None = None) -> Figure:
    """Weights, gradients and optimizer state of each model, stacked, against one GPU's memory.

    ``models`` maps a label to a parameter count, e.g. ``{"7B": 7e9, "70B": 70e9}``.
    The bytes are ``parlab.cost.training_bytes`` (mixed-precision Adam: 2 + 2 + 12
    bytes per parameter by default, ZeRO §3.1); activations are not included.
    A dashed line marks ``gpu_memory`` (an 80 GB H100 by default), and each bar
    is labelled with its total and the fewest GPUs whose memory together holds
    it, ceil(total / gpu_memory).
    """
    if not isinstance(models, Mapping) or not models:
        raise ValueError("models must be a non-empty dict of label -> number of parameters, "
                         "e.g. {'7B': 7e9, '70B': 70e9}")
    gpu_memory = _positive("gpu_memory", gpu_memory)
    states = {label: cost.training_bytes(_positive(f"models[{label!r}]", n), weight_bytes, grad_bytes,
                                         optim_bytes) for label, n in models.items()}
    size, unit = _byte_unit(max(max(b.total for b in states.values()), gpu_memory))
    parts = [("weights", "params", weight_bytes), ("gradients", "grads", grad_bytes),
             ("optimizer state", "optimizer", optim_bytes)]
    owns = ax is None
    fig, ax = _new_axes(ax, (max(6.0, 1.2 * len(models) + 3), 4.8))
    for i, b in enumerate(states.values()):
        bottom = 0.0
        for (_, key, _), v in zip(parts, (b.weights, b.grads, b.optimizer)):
            ax.bar(i, v / size, 0.6, bottom=bottom, color=_MEM_COLORS[key], edgecolor="white", lw=0.8)
            bottom += v / size
        gpus = math.ceil(b.total / gpu_memory)
        ax.text(i, bottom, f"{_plain(bottom)} {unit}\n≥ {gpus} GPU{'s' if gpus > 1 else ''}",
                ha="center", va="bottom", fontsize=8, zorder=4,
                bbox=dict(facecolor="white", edgecolor="none", pad=1))
    ax.axhline(gpu_memory / size, color="black", ls="--", lw=1.3)
    ax.set_xticks(range(len(models)), [str(k) for k in models])
    ax.set_ylabel(f"training state ({unit})", fontsize=11)
    ax.margins(y=0.18)
    ax.set_title(title or "memory to train, before activations (mixed-precision Adam)", fontsize=12)
    _clean(ax)
    handles = [Patch(color=_MEM_COLORS[key], label=f"{name} ({per:g} B/param)") for name, key, per in parts]
    handles.append(Line2D([], [], color="black", ls="--", lw=1.3,
                          label=f"one GPU: {_plain(gpu_memory / size)} {unit}"))
    _legend(fig, ax, handles, owns, ncol=2)
    return fig


_DURATIONS = (("1 day", 1), ("1 month", 30), ("1 year", 365))


def time_to_train_curves(models: Mapping[str, tuple[float, float]],
                         gpus: Sequence[int] = (1, 8, 64, 512, 4096), *,
                         peak_flops: float = cost.H100_BF16_PEAK, mfu: float = 0.4,
                         title: str | None = None, ax: Axes | None = None) -> Figure:
    """Days to train against the number of GPUs, log-log, one line per model.

    ``models`` maps a label to ``(n_params, tokens)``, e.g.
    ``{"70B, 15T tokens": (70e9, 15e12)}``.  Days are
    ``parlab.cost.time_to_train(n_params, tokens, n, peak_flops, mfu) / 86400``,
    i.e. 6·N·tokens / (n × peak × MFU): the same MFU at every n, so perfect
    scaling is assumed (real jobs lose some to communication).  Grey lines
    mark a day, a month and a year.
    """
    if not isinstance(models, Mapping) or not models:
        raise ValueError("models must be a non-empty dict of label -> (n_params, tokens), "
                         "e.g. {'70B, 15T tokens': (70e9, 15e12)}")
    counts = list(gpus) if isinstance(gpus, Sequence) and not isinstance(gpus, str) else []
    if not counts or any(isinstance(n, bool) or not isinstance(n, int) or n < 1 for n in counts):
        raise ValueError(f"gpus must be a non-empty list of GPU counts (ints >= 1), got {gpus!r}")
    counts = sorted(set(counts))
    days = {}
    for label, pair in models.items():
        if not isinstance(pair, (tuple, list)) or len(pair) != 2:
            raise ValueError(f"models[{label!r}] must be a pair (n_params, tokens), got {pair!r}")
        n_params, tokens = (_positive(f"{name} of models[{label!r}]", v)
                            for name, v in zip(("n_params", "tokens"), pair))
        days[label] = [cost.time_to_train(n_params, tokens, n, peak_flops, mfu) / cost.SECONDS_PER_DAY
                       for n in counts]
    owns = ax is None
    fig, ax = _new_axes(ax, (7.5, 4.8))
    handles = []
    for i, (label, ys) in enumerate(days.items()):
        handles += ax.plot(counts, ys, marker="o", ms=4, lw=1.8, color=_TAB10[i % 10], label=label)
    for j, (name, value) in enumerate(_DURATIONS):
        handles.append(ax.axhline(value, color="#888888", lw=1, ls=(":", "-.", "--")[j], label=name))
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.xaxis.set_major_locator(FixedLocator(counts))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _pos: f"{x:,.0f}"))
    ax.xaxis.set_minor_locator(FixedLocator([]))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda y, _pos: _plain(y)))
    ax.set_xlabel("number of GPUs", fontsize=11)
    ax.set_ylabel("days to train", fontsize=11)
    ax.grid(True, which="major", alpha=0.3)
    ax.set_title(title or f"6·N·tokens / (GPUs × {peak_flops / 1e12:,.0f} TFLOP/s × MFU {mfu:.0%}), "
                 "perfect scaling", fontsize=11)
    _clean(ax)
    _legend(fig, ax, handles, owns, ncol=min(len(handles), 3))
    return fig


# ---------------------------------------------------------------- bandwidth

def _binary_size(x: float, _pos=None) -> str:
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if x >= size:
            return f"{x / size:g} {unit}"
    return f"{x:g} B"


def bandwidth_curves(sizes_bytes: Sequence[float], curves: Mapping[str, Sequence[float]], *,
                     op: str = "all_reduce", n: int = 4, metric: str = "busbw",
                     reference_lines: Mapping[str, float] | None = None, logy: bool = False,
                     title: str | None = None, ax: Axes | None = None) -> Figure:
    """Bandwidth against message size, as nccl-tests reports it.

    ``curves`` maps a label to the seconds each size took.  algbw = S / t with
    S the full buffer in bytes (for all_gather / reduce_scatter: per-rank
    count x n); busbw = algbw x factor, the factor being 2(n-1)/n for
    all_reduce, (n-1)/n for all_gather / reduce_scatter / all_to_all and 1
    for broadcast / reduce.  ``reference_lines`` draws horizontal lines,
    e.g. ``{"NVLink ring, DGX H100": 370}`` in GB/s.
    """
    if metric not in ("busbw", "algbw"):
        raise ValueError(f"metric must be 'busbw' or 'algbw', got {metric!r}")
    if not isinstance(n, int) or n < 1:
        raise ValueError(f"n (number of ranks) must be an int >= 1, got {n!r}")
    factor = busbw_factor(op, n) if metric == "busbw" else 1.0
    if factor == 0:
        raise ValueError(f"busbw of {op} is zero for n=1 (nothing crosses a link); use metric='algbw'")
    sizes = [float(s) for s in sizes_bytes]
    if not sizes or min(sizes) <= 0:
        raise ValueError("sizes_bytes must be a non-empty list of positive sizes")
    if not curves:
        raise ValueError("curves is empty: give at least one label -> seconds list")
    for label, times in curves.items():
        if len(times) != len(sizes):
            raise ValueError(f"curve {label!r} has {len(times)} times for {len(sizes)} sizes")
        if min(times) <= 0:
            raise ValueError(f"curve {label!r} has a non-positive time; times are seconds > 0")
    fig, ax = _new_axes(ax, (7.5, 4.6))
    for i, (label, times) in enumerate(curves.items()):
        gbps = [s / t * factor / 1e9 for s, t in zip(sizes, times)]
        ax.plot(sizes, gbps, marker="o", ms=4, lw=1.8, label=label, color=_TAB10[i % 10])
    for j, (label, value) in enumerate((reference_lines or {}).items()):
        ax.axhline(value, color="#555555", ls=("--", ":", "-.")[j % 3], lw=1.2, label=label)
    ax.set_xscale("log", base=2)
    lo, hi = math.floor(math.log2(min(sizes))), math.ceil(math.log2(max(sizes)))
    step = max(1, math.ceil((hi - lo + 1) / 8))
    ax.xaxis.set_major_locator(FixedLocator([2.0**k for k in range(lo, hi + 1, step)]))
    ax.xaxis.set_major_formatter(FuncFormatter(_binary_size))
    ax.xaxis.set_minor_locator(FixedLocator([]))
    if logy:
        ax.set_yscale("log")
    else:
        ax.set_ylim(bottom=0)
    ax.set_xlabel("message size S", fontsize=11)
    ax.set_ylabel(f"{metric} (GB/s)", fontsize=11)
    how = f"busbw = S/t × {factor:.3g}" if metric == "busbw" else "algbw = S/t"
    ax.set_title(title or f"{op}, n = {n} ranks ({how})", fontsize=12)
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(fontsize=9, frameon=False)
    _clean(ax)
    return fig


# ---------------------------------------------------------------- device mesh

_NODE_EDGE = "#c0392b"


def _node_edges(ax: Axes, node_of: dict[tuple[int, int, int], int], x_of) -> None:
    """A dashed line on every side of a (stage, row, column) cell whose neighbour is on
    another node or absent: the outline of each node's cells."""
    for p, row, col in node_of:
        x0, here = x_of(p, col), node_of[(p, row, col)]
        sides = {(0, -1): ((x0, row), (x0 + 1, row)), (0, 1): ((x0, row + 1), (x0 + 1, row + 1)),
                 (-1, 0): ((x0, row), (x0, row + 1)), (1, 0): ((x0 + 1, row), (x0 + 1, row + 1))}
        for (dc, dr), ((xa, ya), (xb, yb)) in sides.items():
            if node_of.get((p, row + dr, col + dc)) != here:
                ax.plot([xa, xb], [ya, yb], color=_NODE_EDGE, lw=2.2, ls=(0, (4, 2)),
                        solid_capstyle="butt", zorder=3)


def mesh_picture(*, pp: int = 1, dp: int = 1, tp: int = 1, highlight: str | None = "tp",
                 gpus_per_node: int | None = None, ax: Axes | None = None) -> Figure:
    """The device mesh ``torch.arange(pp*dp*tp).view(pp, dp, tp)``, TP innermost.

    Rank r sits at (p, d, t) with r = p·(dp·tp) + d·tp + t (``parlab.parallel.mesh``,
    the order of ``init_device_mesh(..., (pp, dp, tp))``).  Each pipeline stage
    p is a dp x tp block (rows d, columns t), so reading a block left to
    right, top to bottom counts ranks up.  ``highlight`` colours the groups
    along one axis: "tp" (same p and d: a row of a block), "dp" (same p and
    t: a column), "pp" (same d and t: the same cell in every block).

    ``gpus_per_node`` draws the node boundaries (ranks 0..g-1 on node 0, and
    so on, as a launcher numbers GPUs) and says in the title whether every
    TP group stays inside one node.  The sizes are keyword-only, so that no
    call written for another axis order draws the wrong mesh.
    """
    from .parallel.mesh import Mesh

    for name, v in (("pp", pp), ("dp", dp), ("tp", tp)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} must be a positive int, got {v!r}")
    if highlight not in ("tp", "dp", "pp", None):
        raise ValueError(f"highlight must be 'tp', 'dp', 'pp' or None, got {highlight!r}")
    if gpus_per_node is not None and (isinstance(gpus_per_node, bool) or not isinstance(gpus_per_node, int)
                                      or gpus_per_node < 1):
        raise ValueError(f"gpus_per_node must be a positive int or None, got {gpus_per_node!r}")
    mesh = Mesh(pp=pp, dp=dp, tp=tp)
    world = mesh.world_size
    if world > 256:
        raise ValueError(f"{world} ranks is too many to draw legibly (at most 256)")
    gap = 0.8
    owns = ax is None
    fig, ax = _new_axes(ax, (max(6.0, pp * (tp + gap) * 0.95 + 1.5), max(3.4, dp * 0.95 + 3.0)))
    groups = mesh.groups(highlight) if highlight else [[r for r in range(world) if mesh.coords(r).p == p]
                                                         for p in range(pp)]
    group_index = {r: i for i, g in enumerate(groups) for r in g}
    # group colours come from palettes other than the rank palette, so a group
    # is never mistaken for a rank
    palette = matplotlib.colormaps["Set2" if len(groups) <= 8 else "Set3"].colors
    fs = 13 if world <= 32 else 10

    def x_of(p: int, t: int) -> float:
        return p * (tp + gap) + t

    node_of = {}
    for rank in range(world):
        p, d, t = mesh.coords(rank)
        node_of[(p, d, t)] = rank // gpus_per_node if gpus_per_node else 0
        face = palette[group_index[rank] % len(palette)]
        ax.add_patch(Rectangle((x_of(p, t) + 0.06, d + 0.06), 0.88, 0.88, facecolor=face,
                               edgecolor="white", alpha=0.85))
        ax.text(x_of(p, t) + 0.5, d + 0.42, str(rank), ha="center", va="center",
                fontsize=fs, fontweight="bold", color=_text_color(face))
        ax.text(x_of(p, t) + 0.5, d + 0.78, f"({p},{d},{t})", ha="center", va="center",
                fontsize=7, color=_text_color(face))
    for p in range(pp):
        ax.text(x_of(p, 0) + tp / 2, -0.35, f"stage p = {p}", ha="center", va="bottom", fontsize=10)
        for t in range(tp):
            ax.text(x_of(p, t) + 0.5, dp + 0.1, f"t = {t}", ha="center", va="top", fontsize=9)
        if highlight in ("tp", "dp"):  # outline each group: a row (tp) or a column (dp)
            for i in range(dp if highlight == "tp" else tp):
                xy, w, h = ((x_of(p, 0), i), tp, 1) if highlight == "tp" else ((x_of(p, i), 0), 1, dp)
                ax.add_patch(FancyBboxPatch((xy[0] + 0.02, xy[1] + 0.02), w - 0.04, h - 0.04,
                                            boxstyle="round,pad=0,rounding_size=0.12",
                                            fill=False, lw=2, edgecolor="#333333"))
    for d in range(dp):
        ax.text(-0.1, d + 0.5, f"d = {d}", ha="right", va="center", fontsize=9)
    if gpus_per_node:
        _node_edges(ax, node_of, x_of)
    ax.set_xlim(-0.9, x_of(pp - 1, tp) + 0.1)
    ax.set_ylim(dp + 0.55, -0.85)
    ax.set_aspect("equal")
    ax.axis("off")
    what = f"{highlight.upper()} groups coloured" if highlight else "coloured by stage"
    heading = (f"mesh pp={pp} × dp={dp} × tp={tp} ({world} ranks), {what}\n"
               "rank = p·(dp·tp) + d·tp + t,  mesh = torch.arange(world).view(pp, dp, tp)")
    if gpus_per_node:
        nodes = -(-world // gpus_per_node)
        split = sum(len({r // gpus_per_node for r in g}) > 1 for g in mesh.groups("tp"))
        heading += (f"\n{nodes} node{'s' if nodes > 1 else ''} of {gpus_per_node} GPUs: "
                    + ("every TP group stays inside one node" if not split else
                       f"TP groups that cross a node boundary: {split} of {len(mesh.groups('tp'))}"))
    (fig.suptitle if owns else ax.set_title)(heading, fontsize=11)
    names = {"tp": "TP group", "dp": "DP group", "pp": "PP group", None: "stage"}
    handles = [Patch(color=palette[i % len(palette)], label=f"{names[highlight]} {i}: ranks "
                     f"{', '.join(map(str, g))}") for i, g in enumerate(groups[:8])]
    if len(groups) > 8:
        handles.append(Patch(color="white", label=f"... {len(groups)} groups in all"))
    if gpus_per_node:
        handles.append(Line2D([], [], color=_NODE_EDGE, lw=2.2, ls=(0, (4, 2)),
                              label=f"node boundary: node k holds ranks {gpus_per_node}k to "
                                    f"{gpus_per_node}k + {gpus_per_node - 1}"))
    _legend(fig, ax, handles, owns, ncol=2 if len(handles) > 3 else len(handles))
    return fig
