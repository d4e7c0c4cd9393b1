"""The lecture's figure for lab 08 (what a real configuration sets), from parlab at build time.

``checkpoint_reshard`` draws which rows of one tensor each rank holds when the
tensor is saved on one number of ranks and loaded on others, with the split
that lab 08's checker grades (``parlab.grading.lab08.clipping.rows_of``):
FSDP2's, rank r of N holding rows [min(r·c, R), min((r + 1)·c, R)) with
c = ceil(R / N), which is ``torch.chunk`` padded with empty shards.  An exact
diagram, not a measurement: lab 08 saves and loads the files.
"""
from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import Rectangle  # noqa: E402

from parlab import viz  # noqa: E402
from parlab.grading.lab08.clipping import rows_of  # noqa: E402

RESHARD = dict(rows=7, saved=3, loaded=(2, 4))  # R = 7 rows saved on 3 ranks, loaded on 2 and on 4


def shard_rows(rows: int, n: int) -> list[tuple[int, int]]:
    """[start, stop) of every rank's rows, as lab 08's checker splits them."""
    return [rows_of(rows, r, n) for r in range(n)]


def checkpoint_reshard():
    """Rows of a 7-row tensor per rank: saved on 3 ranks, loaded on 2 and on 4 (exact diagram)."""
    R, saved, loaded = RESHARD["rows"], RESHARD["saved"], RESHARD["loaded"]
    layouts = [("saved on", saved)] + [("loaded on", n) for n in loaded]  # each load reads the saved files
    fig, ax = plt.subplots(figsize=(10, 2.7), layout="constrained")
    plt.close(fig)
    for line, (verb, n) in enumerate(layouts):
        y = line * 1.25
        ax.text(-0.25, y + 0.45, f"{verb} N = {n}\nc = ceil({R}/{n}) = {-(-R // n)}", ha="right", va="center",
                fontsize=11, fontweight="bold" if verb == "saved on" else "normal")
        for rank, (a, b) in enumerate(shard_rows(R, n)):
            for row in range(a, b):
                ax.add_patch(Rectangle((row + 0.04, y), 0.92, 0.9, facecolor=viz.rank_color(rank), edgecolor="white"))
                ax.text(row + 0.5, y + 0.45, f"row {row}", ha="center", va="center", fontsize=10, color="white")
            held = f"row {a}" if b == a + 1 else f"rows {a}–{b - 1}"
            if b > a:  # a rank with no rows (r·c ≥ R) gets no label
                ax.text((a + b) / 2, y + 1.0, f"rank {rank}: {held}", ha="center", va="top", fontsize=9.5,
                        color=viz.rank_color(rank))
    ax.set_xlim(-2.6, R + 0.1)
    ax.set_ylim(len(layouts) * 1.25, -0.1)
    ax.axis("off")
    ax.set_title(f"one tensor of R = {R} rows: rank r holds rows [min(r·c, R), min((r + 1)·c, R)), c = ceil(R/N), "
                 "FSDP2's torch.chunk split (exact)", fontsize=10.5)
    return fig


FIGURES = {
    "checkpoint_reshard": checkpoint_reshard,
}
