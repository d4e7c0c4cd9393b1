"""Causal ring attention's work per rank for a split of the sequence (lab 07, section 3).

``causal_work({"plain": positions, "zig-zag": positions})`` draws, for each
layout, the causal mask of the whole sequence with every (query, key) pair
that is computed coloured by the rank that owns the query, and beside it the
pairs each rank computes.  ``positions`` is the (c, L) table lab 07 passes to
``ring_attention``: row r holds the global positions of rank r's tokens.
The counts are exact (a query at position p attends to the p + 1 keys at
positions ≤ p), not a measurement: lab 07 measures the time.
"""
from __future__ import annotations

from matplotlib.figure import Figure

from .style import clean_axes, rank_color


def causal_pairs(positions) -> list[int]:
    """The (query, key) pairs each rank computes under a causal mask: Σ (p + 1) over its positions."""
    rows = [[int(p) for p in row] for row in positions]
    flat = sorted(p for row in rows for p in row)
    if flat != list(range(len(flat))):
        raise ValueError("positions must hold each of 0 .. s−1 exactly once (row r: rank r's tokens); "
                         f"got {len(flat)} entries that are not a permutation of 0..{len(flat) - 1}")
    return [sum(p + 1 for p in row) for row in rows]


def max_over_mean(values) -> float:
    """max ÷ mean: 1 when every rank does the same work."""
    values = list(values)
    return max(values) / (sum(values) / len(values))


def causal_work(layouts: dict, title: str | None = None) -> Figure:
    """For each layout (name -> (c, L) positions): the causal mask coloured by rank, and pairs per rank."""
    import matplotlib.pyplot as plt
    import numpy as np

    if not layouts:
        raise ValueError("give at least one layout: {name: positions of shape (c, L)}")
    fig, axes = plt.subplots(2, len(layouts), figsize=(4.2 * len(layouts), 6.4), layout="constrained",
                             height_ratios=[1.55, 1], squeeze=False)
    plt.close(fig)
    for col, (name, positions) in enumerate(layouts.items()):
        pairs = causal_pairs(positions)
        rows = [[int(p) for p in row] for row in positions]
        s, c = sum(len(r) for r in rows), len(rows)
        owner = [0] * s
        for r, row in enumerate(rows):
            for p in row:
                owner[p] = r
        image = np.ones((s, s, 3))
        for q in range(s):
            image[q, :q + 1] = rank_color(owner[q])
        mask, bars = axes[0][col], axes[1][col]
        mask.imshow(image, interpolation="nearest")
        mask.set_title(f"{name}: rows = queries, columns = keys", fontsize=10)
        mask.set_xticks([])
        mask.set_yticks([])
        mask.set_xlabel("keys ≤ query are computed", fontsize=9)
        mean = sum(pairs) / c
        bars.bar([f"rank {r}" for r in range(c)], [p / mean for p in pairs],
                 color=[rank_color(r) for r in range(c)])
        bars.axhline(1.0, color="#555555", lw=1, ls=":")
        bars.set_ylim(0, 2.05)
        bars.set_ylabel("pairs ÷ mean", fontsize=9)
        bars.set_title(f"max ÷ mean = {max_over_mean(pairs):.2f}", fontsize=10)
        clean_axes(bars)
    if title:
        fig.suptitle(title, fontsize=11)
    return fig
