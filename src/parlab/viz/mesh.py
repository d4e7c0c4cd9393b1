"""A (pipeline, data, tensor) device mesh, with one axis's groups highlighted and the
node boundaries drawn.
"""
from __future__ import annotations

import matplotlib
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import FancyBboxPatch, Patch, Rectangle

from .style import place_legend, new_axes, text_color


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
    from ..parallel.mesh import Mesh

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
    fig, ax = new_axes(ax, (max(6.0, pp * (tp + gap) * 0.95 + 1.5), max(3.4, dp * 0.95 + 3.0)))
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
                fontsize=fs, fontweight="bold", color=text_color(face))
        ax.text(x_of(p, t) + 0.5, d + 0.78, f"({p},{d},{t})", ha="center", va="center",
                fontsize=7, color=text_color(face))
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
    place_legend(fig, ax, handles, owns, ncol=2 if len(handles) > 3 else len(handles))
    return fig
