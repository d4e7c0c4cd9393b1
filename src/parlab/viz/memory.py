"""Memory per rank by kind (parameters, gradients, optimizer states, activations),
measured beside predicted.
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from .style import clean_axes, place_legend, new_axes
from .timeline import EXTRA_COLORS


_MEM_ORDER = ["params", "grads", "optimizer", "activations"]


MEM_COLORS = {"params": "#4e79a7", "grads": "#f28e2b", "optimizer": "#59a14f",
               "activations": "#b07aa1", "other": "#9aa5b1"}


def byte_unit(x: float) -> tuple[float, str]:
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
    extra = iter(EXTRA_COLORS * 10)
    colors = {c: MEM_COLORS.get(c) or next(extra) for c in cats}
    size, unit = byte_unit(max(sum(t[k].values()) for t in tables for k in t))
    labels = list(measured)
    owns = ax is None
    fig, ax = new_axes(ax, (max(6.0, 1.3 * len(labels) + 3), 4.6))
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
    clean_axes(ax)
    handles = [Patch(color=colors[c], label=c) for c in cats]
    if predicted:
        handles += [Patch(facecolor="#999999", label="measured"),
                    Patch(facecolor="#999999", alpha=0.6, hatch="//", edgecolor="white",
                          label="predicted")]
    place_legend(fig, ax, handles, owns, ncol=min(len(handles), 6))
    return fig
