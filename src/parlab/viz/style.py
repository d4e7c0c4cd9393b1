"""What every parlab figure shares: the rank palette, new axes that are closed in pyplot,
text colour on a face, and the legend placement.
"""
from __future__ import annotations

import matplotlib
from matplotlib.axes import Axes
from matplotlib.colors import to_rgb
from matplotlib.figure import Figure


TAB10 = matplotlib.colormaps["tab10"].colors


def rank_color(rank: int) -> tuple[float, float, float]:
    """The colour of ``rank`` in every parlab figure."""
    return TAB10[rank % 10]


def new_axes(ax: Axes | None, size: tuple[float, float]) -> tuple[Figure, Axes]:
    if ax is not None:
        return ax.figure, ax
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=size, layout="constrained")
    plt.close(fig)  # returned, not auto-shown: no double display, no leak
    return fig, ax


def text_color(face) -> str:
    r, g, b = to_rgb(face)
    return "white" if 0.299 * r + 0.587 * g + 0.114 * b < 0.55 else "black"


def clean_axes(ax: Axes) -> None:
    ax.spines[["top", "right"]].set_visible(False)
    ax.tick_params(labelsize=10)


def place_legend(fig: Figure, ax: Axes, handles, owns_figure: bool, ncol: int) -> None:
    if owns_figure:  # below the plot, laid out by constrained layout: never over data
        fig.legend(handles=handles, loc="outside lower center", ncol=ncol, frameon=False,
                   fontsize=9)
    else:
        ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1), frameon=False,
                  fontsize=9)
