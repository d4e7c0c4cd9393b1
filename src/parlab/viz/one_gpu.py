"""Lab 00: why one GPU is not enough: the training memory of a model against a GPU,
and the days to train it against the number of GPUs.
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.ticker import FixedLocator, FuncFormatter

from .. import cost
from .memory import MEM_COLORS, byte_unit
from .style import TAB10, clean_axes, place_legend, new_axes


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
    size, unit = byte_unit(max(max(b.total for b in states.values()), gpu_memory))
    parts = [("weights", "params", weight_bytes), ("gradients", "grads", grad_bytes),
             ("optimizer state", "optimizer", optim_bytes)]
    owns = ax is None
    fig, ax = new_axes(ax, (max(6.0, 1.2 * len(models) + 3), 4.8))
    for i, b in enumerate(states.values()):
        bottom = 0.0
        for (_, key, _), v in zip(parts, (b.weights, b.grads, b.optimizer)):
            ax.bar(i, v / size, 0.6, bottom=bottom, color=MEM_COLORS[key], edgecolor="white", lw=0.8)
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
    clean_axes(ax)
    handles = [Patch(color=MEM_COLORS[key], label=f"{name} ({per:g} B/param)") for name, key, per in parts]
    handles.append(Line2D([], [], color="black", ls="--", lw=1.3,
                          label=f"one GPU: {_plain(gpu_memory / size)} {unit}"))
    place_legend(fig, ax, handles, owns, ncol=2)
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
    fig, ax = new_axes(ax, (7.5, 4.8))
    handles = []
    for i, (label, ys) in enumerate(days.items()):
        handles += ax.plot(counts, ys, marker="o", ms=4, lw=1.8, color=TAB10[i % 10], label=label)
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
    clean_axes(ax)
    place_legend(fig, ax, handles, owns, ncol=min(len(handles), 3))
    return fig
