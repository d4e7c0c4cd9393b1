"""Bus bandwidth against message size, one curve per collective or backend.
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import FixedLocator, FuncFormatter

from ..cost import busbw_factor
from .style import TAB10, clean_axes, new_axes


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
    fig, ax = new_axes(ax, (7.5, 4.6))
    for i, (label, times) in enumerate(curves.items()):
        gbps = [s / t * factor / 1e9 for s, t in zip(sizes, times)]
        ax.plot(sizes, gbps, marker="o", ms=4, lw=1.8, label=label, color=TAB10[i % 10])
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
    clean_axes(ax)
    return fig
