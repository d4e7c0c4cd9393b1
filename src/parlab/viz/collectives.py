"""Lab 01: what each rank holds before and after a collective, as a grid of chunks.
"""
from __future__ import annotations

import textwrap

from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.patches import Patch, Rectangle

from .style import clean_axes, new_axes, text_color, rank_color


_SUM_COLOR = "#2f3e4e"  # reduced (Σ) chunks


_EMPTY_EDGE = "#b0b0b0"


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
                    color="black" if faded else text_color(face), fontweight="bold")


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
    clean_axes(ax)


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
    fig, ax = new_axes(ax, (width, 0.62 * n + 2.1))
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
