"""Figures for the labs and slides: collectives, Gantt charts, memory, bandwidth, mesh,
and lab 00's memory and time-to-train arithmetic.

One module per kind of figure: ``collectives``, ``timeline`` (Gantt charts),
``memory``, ``one_gpu`` (lab 00's memory and time to train), ``bandwidth``,
``mesh`` and ``context`` (causal attention's work per rank for a split of the sequence); ``style`` holds the palette and the axes and legend helpers they share.

Every function returns a ``matplotlib.figure.Figure``.  The figure is closed
in pyplot before it is returned, so a notebook shows it once when it is the
cell's last expression, and a loop that makes many figures leaks nothing.
Pass ``ax=`` to draw into an axes of your own figure instead.

One palette throughout: rank r is always ``rank_color(r)`` (matplotlib's
tab10), and a kind of work (forward, backward, all_reduce, ...) is always the
same colour in every Gantt chart.
"""
from .style import rank_color
from .collectives import collective_diagram, COLLECTIVE_OPS
from .timeline import gantt
from .memory import memory_bars
from .one_gpu import training_memory_bars, time_to_train_curves
from .bandwidth import bandwidth_curves
from .mesh import mesh_picture
from .context import causal_work, causal_pairs

__all__ = [
    "rank_color",
    "collective_diagram",
    "gantt",
    "memory_bars",
    "training_memory_bars",
    "time_to_train_curves",
    "bandwidth_curves",
    "mesh_picture",
    "causal_work",
    "causal_pairs",
    "COLLECTIVE_OPS",
]
