"""The lecture figures that ``parlab.viz`` does not draw yet, from ``parlab.cost`` numbers.

``render(folder)`` writes every figure to ``folder/<name>.png`` and returns the
paths.  Each figure is either an exact diagram, a formula evaluated by
``parlab.cost``, or an *ideal* schedule computed here; none is a measurement,
and each one's title says which it is.  ``slides/make_figures.py`` draws the
rest with ``parlab.viz`` (collectives, meshes, training memory, time to train);
``slides/planner_figures.py`` the scenarios and the calculator, from ``parlab.planner``;
``slides/context_expert_figures.py`` lab 07's context and expert parallelism;
``slides/real_config_figures.py`` lab 08's checkpoint resharding.
"""
from __future__ import annotations

import os

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import FancyBboxPatch, Rectangle  # noqa: E402

from parlab import cost, viz  # noqa: E402
from parlab.parallel import pp_schedule  # noqa: E402
from parlab.parallel.mesh import Mesh  # noqa: E402

import context_expert_figures  # noqa: E402  (slides/context_expert_figures.py, next to this file)
import planner_figures  # noqa: E402  (slides/planner_figures.py, next to this file)
import real_config_figures  # noqa: E402  (slides/real_config_figures.py, next to this file)

GB = 1e9
DPI = 150
_SUM = "#2f3e4e"
_PARTIAL = "#d9dee4"
_LINE80 = "#c0392b"


def _figure(w: float, h: float, **kw):
    fig, ax = plt.subplots(figsize=(w, h), layout="constrained", **kw)
    plt.close(fig)
    return fig, ax


def _capacity_line(ax, gb: float = cost.H100_MEMORY / GB) -> None:
    ax.axhline(gb, color=_LINE80, ls="--", lw=1.6)
    ax.text(ax.get_xlim()[1], gb, f" one H100: {gb:.0f} GB", color=_LINE80, va="bottom",
            ha="right", fontsize=10)


# ---------------------------------------------------------------- memory

def zero_stages(psi: float = 7.5e9, nd: int = 64):
    """Per-GPU model states for plain DP and ZeRO-1/2/3 (Rajbhandari et al., ZeRO, §5)."""
    b = cost.training_bytes(psi)
    bars = {
        "DP\n16Ψ": {"params": b.weights, "grads": b.grads, "optimizer": b.optimizer},
        "ZeRO-1\n4Ψ + 12Ψ/N": {"params": b.weights, "grads": b.grads, "optimizer": b.optimizer / nd},
        "ZeRO-2\n2Ψ + 14Ψ/N": {"params": b.weights, "grads": b.grads / nd, "optimizer": b.optimizer / nd},
        "ZeRO-3 / FSDP\n16Ψ/N": {"params": b.weights / nd, "grads": b.grads / nd,
                                 "optimizer": b.optimizer / nd},
    }
    for stage, cats in enumerate(bars.values()):  # the bars are exactly parlab.cost's formula
        expected = cost.zero_memory_per_gpu(psi, nd, stage)
        assert abs(sum(cats.values()) - expected) < 1e-6 * expected, (stage, cats, expected)
    fig, ax = _figure(7.5, 4.6)
    viz.memory_bars(bars, ax=ax, title=f"model states per GPU, Ψ = {psi / 1e9:g}B, N = {nd} (GB)")
    _capacity_line(ax)
    return fig


# ---------------------------------------------------------------- ring all-reduce

def _ring_states(n: int):
    """Contributors of every (rank, chunk) after each step of the ring all-reduce (lab 01, Ex 2)."""
    held = [[{r} for _ in range(n)] for r in range(n)]
    states = [("start: rank r holds its own buffer", [[set(c) for c in row] for row in held], set())]
    for phase, shift in (("reduce-scatter", 0), ("all-gather", 1)):
        for s in range(n - 1):
            sent = {r: (r + shift - s) % n for r in range(n)}  # chunk rank r sends right
            new = [[set(c) for c in row] for row in held]
            moved = set()
            for r, c in sent.items():
                dst = (r + 1) % n
                new[dst][c] = (held[dst][c] | held[r][c]) if phase == "reduce-scatter" else set(held[r][c])
                moved.add((dst, c))
            held = new
            rule = "(r − s) mod n" if shift == 0 else "(r + 1 − s) mod n"
            states.append((f"{phase} step s={s}: rank r sends chunk {rule} to r+1",
                           [[set(c) for c in row] for row in held], moved))
    return states


def ring_allreduce(n: int = 4):
    """The 2(n−1) steps of a ring all-reduce: who holds which partial sum after each step."""
    states = _ring_states(n)
    rows, cols = 2, n
    fig, axes = plt.subplots(rows, cols, figsize=(3.1 * cols, 3.3 * rows), layout="constrained")
    plt.close(fig)
    letters = "abcdefgh"
    slots = [axes[0][i] for i in range(n)] + [axes[1][i] for i in range(1, n)]
    for ax, (title, grid, moved) in zip(slots, states):
        for r in range(n):
            for j in range(n):
                who = grid[r][j]
                if len(who) == n:
                    face, label = _SUM, f"Σ{j}"
                elif len(who) == 1:
                    face, label = viz.rank_color(next(iter(who))), f"{letters[next(iter(who))]}{j}"
                else:
                    face, label = _PARTIAL, "+".join(letters[k] for k in sorted(who))
                edge, lw = ("black", 2.6) if (r, j) in moved else ("white", 1)
                ax.add_patch(Rectangle((j + 0.05, r + 0.05), 0.9, 0.9, facecolor=face,
                                       edgecolor=edge, lw=lw))
                ax.text(j + 0.5, r + 0.5, label, ha="center", va="center", fontsize=9,
                        color="white" if face == _SUM else "black", fontweight="bold")
            ax.text(-0.08, r + 0.5, f"rank {r}", ha="right", va="center", fontsize=9,
                    color=viz.rank_color(r))
        for j in range(n):
            ax.text(j + 0.5, -0.1, f"chunk {j}", ha="center", va="bottom", fontsize=8)
        ax.set_title("\n".join(_wrap(title, 34)), fontsize=10)
        ax.set_xlim(-0.9, n)
        ax.set_ylim(n + 0.05, -0.5)
        ax.set_aspect("equal")
        ax.axis("off")
    legend = axes[1][0]
    legend.axis("off")
    legend.text(0, 0.95, f"ring all-reduce, n = {n}\n\nrank r sends to r+1,\nreceives from r−1.\n\n"
                "black border: received\nin this step\ngrey: partial sum\nΣj: the full sum of chunk j\n\n"
                f"each rank sends 2(n−1) = {2 * (n - 1)}\nchunks of S/n bytes:\n"
                "2(n−1)/n · S in all", va="top", fontsize=10, transform=legend.transAxes)
    return fig


def _wrap(text: str, width: int) -> list[str]:
    import textwrap
    return textwrap.wrap(text, width)


# ---------------------------------------------------------------- tensor parallelism

def _block(ax, x, y, w, h, label, color, text_color="black", fs=11):
    ax.add_patch(Rectangle((x, y), w, h, facecolor=color, edgecolor="white", lw=1.5))
    ax.text(x + w / 2, y + h / 2, label, ha="center", va="center", fontsize=fs, color=text_color,
            fontweight="bold")


def _op(ax, x, y, text, fs=16):
    ax.text(x, y, text, ha="center", va="center", fontsize=fs)


def tp_splits():
    """Column- and row-parallel linear layers on 2 ranks, and the MLP with f and g (Megatron-LM)."""
    c0, c1, grey = viz.rank_color(0), viz.rank_color(1), "#9aa5b1"
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(11, 7.2), layout="constrained",
                                      height_ratios=[1, 1.05])
    plt.close(fig)
    # column split: X · [A1 | A2] = [X·A1 | X·A2]
    _block(top, 0, 0, 1.4, 2, "X", grey)
    _op(top, 1.75, 1, "·")
    _block(top, 2.1, 0, 1, 2, "A₁", c0, "white")
    _block(top, 3.1, 0, 1, 2, "A₂", c1, "white")
    _op(top, 4.45, 1, "=")
    _block(top, 4.8, 0, 1, 2, "XA₁", c0, "white")
    _block(top, 5.8, 0, 1, 2, "XA₂", c1, "white")
    top.text(3.4, 2.35, "column-parallel: split A's output features;\nrank i computes Y_i = X·A_i, "
             "no communication", ha="center", va="bottom", fontsize=10)
    # row split: [X1 | X2] · [B1 ; B2] = X1·B1 + X2·B2
    x0 = 7.8
    _block(top, x0, 0, 0.7, 2, "Y₁", c0, "white")
    _block(top, x0 + 0.7, 0, 0.7, 2, "Y₂", c1, "white")
    _op(top, x0 + 1.75, 1, "·")
    _block(top, x0 + 2.1, 1, 1.4, 1, "B₁", c0, "white")
    _block(top, x0 + 2.1, 0, 1.4, 1, "B₂", c1, "white")
    _op(top, x0 + 3.85, 1, "=")
    _block(top, x0 + 4.2, 0, 0.9, 2, "Y₁B₁", c0, "white", fs=10)
    _op(top, x0 + 5.35, 1, "+")
    _block(top, x0 + 5.6, 0, 0.9, 2, "Y₂B₂", c1, "white", fs=10)
    top.text(x0 + 3.3, 2.35, "row-parallel: split B's input features;\nthe partial sums need an "
             "all-reduce", ha="center", va="bottom", fontsize=10)
    top.set_xlim(-0.2, x0 + 6.7)
    top.set_ylim(-0.3, 3.3)
    top.set_aspect("equal")
    top.axis("off")
    # the MLP on two ranks: X -> f -> (XA_i -> GeLU -> ·B_i) -> g -> Z
    ax = bottom
    _block(ax, 0, 1.3, 1.1, 1.4, "X", grey)
    ax.add_patch(FancyBboxPatch((1.6, 1.45), 1.2, 1.1, boxstyle="round,pad=0.05", facecolor="#fff3c4",
                                edgecolor="#b8860b", lw=2))
    _op(ax, 2.2, 2.0, "f", fs=20)
    ax.add_patch(FancyBboxPatch((9.2, 1.45), 1.2, 1.1, boxstyle="round,pad=0.05", facecolor="#fff3c4",
                                edgecolor="#b8860b", lw=2))
    _op(ax, 9.8, 2.0, "g", fs=20)
    _block(ax, 10.9, 1.3, 1.1, 1.4, "Z", grey)
    for row, (y, color, i) in enumerate(((3.0, c0, 1), (0.0, c1, 2))):
        _block(ax, 3.4, y, 1.6, 1.0, f"X·A{'₁₂'[i - 1]}", color, "white", fs=10)
        _block(ax, 5.4, y, 1.4, 1.0, "GeLU", color, "white", fs=10)
        _block(ax, 7.2, y, 1.6, 1.0, f"·B{'₁₂'[i - 1]}", color, "white", fs=10)
        ax.text(3.3, y + 0.5, f"rank {row}", ha="right", va="center", fontsize=9, color=color)
        for xa, xb in ((2.8, 3.4), (5.0, 5.4), (6.8, 7.2), (8.8, 9.2)):
            ya = 2.0 if xa == 2.8 else y + 0.5
            yb = 2.0 if xb == 9.2 else y + 0.5
            ax.annotate("", xy=(xb, yb), xytext=(xa, ya),
                        arrowprops=dict(arrowstyle="-|>", color="#555555", lw=1.2))
    for xa, xb in ((1.1, 1.6), (10.4, 10.9)):
        ax.annotate("", xy=(xb, 2.0), xytext=(xa, 2.0),
                    arrowprops=dict(arrowstyle="-|>", color="#555555", lw=1.2))
    ax.text(2.2, -0.55, "f: forward identity,\nbackward all-reduce", ha="center", va="top", fontsize=10)
    ax.text(9.8, -0.55, "g: forward all-reduce,\nbackward identity", ha="center", va="top", fontsize=10)
    ax.text(6.1, 4.5, "MLP = column-parallel then row-parallel: one all-reduce forward (g), "
            "one backward (f)", ha="center", va="bottom", fontsize=11)
    ax.set_xlim(-0.2, 12.2)
    ax.set_ylim(-1.6, 5.0)
    ax.set_aspect("equal")
    ax.axis("off")
    return fig


# ---------------------------------------------------------------- pipeline

def pipeline_schedules(p: int = 4, m: int = 8, fwd: float = 1.0, bwd: float = 2.0):
    """Ideal GPipe and 1F1B on one time axis (computed by parlab.parallel.pp_schedule, not measured)."""
    fig, axes = plt.subplots(2, 1, figsize=(10.5, 6.4), layout="constrained", sharex=True)
    plt.close(fig)
    predicted = cost.bubble_fraction(p, m, "gpipe")
    for ax, name in zip(axes, ("gpipe", "1f1b")):
        spans = pp_schedule.ideal_schedule(p, m, name, forward=fwd, backward=bwd)
        held = pp_schedule.peak_held(spans, rank=0)
        label = {"gpipe": "GPipe (all forwards, then all backwards)", "1f1b": "1F1B"}[name]
        cut = {k: len(ops) for k, ops in pp_schedule.phases(p, m, 0, name).items()}
        phase_text = "" if name == "gpipe" else (
            f"; stage 0: warm-up {cut['warm-up']} F, steady {cut['steady'] // 2} F+B, "
            f"cool-down {cut['cool-down']} B")
        viz.gantt(spans, ax=ax, unit="steps", show_bubble=True, predicted_bubble=predicted,
                  title=f"ideal {label}, p={p}, m={m}: stage 0 holds {held:g} micro-batches' "
                        f"activations{phase_text}")
    axes[1].set_xlabel("time (forward = 1 unit, backward = 2 units)")
    return fig


# ---------------------------------------------------------------- bandwidth

def ring_allreduce_seconds(size_bytes: float, n: int, alpha: float, beta: float) -> float:
    """α–β cost of a ring all-reduce: 2(n−1) steps, each α plus S/n bytes at β bytes/s."""
    return 2 * (n - 1) * (alpha + size_bytes / (n * beta))


# Illustrative parameters, not measurements: an NVLink-class link and a loopback-TCP-class one.
BUSBW_MODELS = {
    "NVLink-class: α = 5 µs, β = 370 GB/s": (5e-6, 370e9),
    "TCP-loopback-class: α = 100 µs, β = 2 GB/s": (100e-6, 2e9),
}


def busbw_model(n: int = 8):
    """busbw (nccl-tests definition) of the α–β ring model over nccl-tests' size range."""
    sizes = [2.0 ** k for k in range(3, 33)]  # 8 B .. 4 GiB
    curves = {label: [ring_allreduce_seconds(s, n, a, b) for s in sizes]
              for label, (a, b) in BUSBW_MODELS.items()}
    fig, ax = _figure(8, 4.8)
    viz.bandwidth_curves(sizes, curves, op="all_reduce", n=n, logy=True, ax=ax,
                         title=f"all_reduce busbw of an α–β ring model, n = {n} (illustrative, "
                               "not measured)")
    return fig


# ---------------------------------------------------------------- scenarios

def _box(ax, x, y, w, h, text, face, fs=10.5):
    ax.add_patch(FancyBboxPatch((x - w / 2, y - h / 2), w, h, boxstyle="round,pad=0.02,rounding_size=0.08",
                                facecolor=face, edgecolor="#555555", lw=1.2))
    ax.text(x, y, text, ha="center", va="center", fontsize=fs, wrap=True)


def _arrow(ax, a, b, label=""):
    ax.annotate("", xy=b, xytext=a, arrowprops=dict(arrowstyle="-|>", color="#333333", lw=1.4))
    if label and a[1] == b[1]:  # horizontal: the label sits above the arrow
        ax.text((a[0] + b[0]) / 2, a[1] + 0.12, label, fontsize=10, fontweight="bold", ha="center",
                va="bottom")
    elif label:
        ax.text((a[0] + b[0]) / 2 + 0.08, (a[1] + b[1]) / 2 + 0.1, label, fontsize=10,
                fontweight="bold", va="bottom" if a[0] != b[0] else "center")


def decision_chart():
    """Which axes to use, as a flow of questions (a rule of thumb, not a planner)."""
    q, a, side = "#e8f0fb", "#e6f4e1", "#fbeee6"
    fig, ax = _figure(11, 6.6)
    _box(ax, 3, 9, 5.4, 1.1, "Do weights + gradients + optimizer states (16 B/param)\n"
         "+ activations fit on one GPU?", q)
    _box(ax, 9, 9, 3.6, 1.1, "DP (DDP): replicate,\nall-reduce the gradients", a)
    _box(ax, 3, 6.6, 5.4, 1.1, "Do they fit once the states are sharded\nover the data-parallel GPUs "
         "(16Ψ/N)?", q)
    _box(ax, 9, 6.6, 3.6, 1.1, "ZeRO-1 → 2 → 3 / FSDP:\nthe cheapest stage that fits", a)
    _box(ax, 3, 4.2, 5.4, 1.1, "Still too big, or too few samples per GPU?\nTP inside one node "
         "(t ≤ 8, NVLink)", q)
    _box(ax, 3, 1.8, 5.4, 1.1, "Add PP across nodes (p stages, m ≫ p micro-batches),\n"
         "then DP / FSDP over the remaining GPUs", a)
    _box(ax, 9, 3.0, 3.6, 2.2, "Activations dominate\n(long sequences)?\nactivation recomputation,\n"
         "sequence parallelism (with TP),\ncontext parallelism", side, fs=10)
    _arrow(ax, (5.7, 9), (7.2, 9), "yes")
    _arrow(ax, (3, 8.45), (3, 7.15), "no")
    _arrow(ax, (5.7, 6.6), (7.2, 6.6), "yes")
    _arrow(ax, (3, 6.05), (3, 4.75), "no")
    _arrow(ax, (3, 3.65), (3, 2.35), "then")
    _arrow(ax, (5.7, 4.2), (7.2, 3.4), "also")
    ax.set_xlim(0, 11.2)
    ax.set_ylim(1, 9.8)
    ax.axis("off")
    ax.set_title("choosing the axes: ask the questions in order", fontsize=12)
    return fig


# ---------------------------------------------------------------- meshes and nodes

def mesh_on_nodes(dp: int = 2, tp: int = 8, gpus_per_node: int = 8):
    """Ranks on two DGX nodes with TP innermost (parlab.parallel.mesh) and, for contrast, outermost."""
    mesh = Mesh(pp=1, dp=dp, tp=tp)
    world = mesh.world_size
    nodes = world // gpus_per_node
    layouts = {
        "TP innermost: rank = d·tp + t (parlab.parallel.mesh)":
            {r: mesh.coords(r).d for r in range(world)},
        "TP outermost: rank = t·dp + d (the wrong order)":
            {r: r % dp for r in range(world)},
    }
    fig, axes = plt.subplots(2, 1, figsize=(11, 3.3), layout="constrained")
    plt.close(fig)
    palette = matplotlib.colormaps["Set2"].colors
    for ax, (title, group_of) in zip(axes, layouts.items()):
        crosses = any(len({r // gpus_per_node for r in range(world) if group_of[r] == g}) > 1
                      for g in set(group_of.values()))
        for node in range(nodes):
            x0 = node * (gpus_per_node + 0.8)
            ax.add_patch(FancyBboxPatch((x0 - 0.1, -0.1), gpus_per_node + 0.2, 1.2,
                                        boxstyle="round,pad=0.02", fill=False, edgecolor="#555555",
                                        lw=1.5, ls="--"))
            ax.text(x0 + gpus_per_node / 2, 1.2, f"node {node} (NVLink inside)", ha="center",
                    va="top", fontsize=9)
            for i in range(gpus_per_node):
                r = node * gpus_per_node + i
                face = palette[group_of[r] % len(palette)]
                ax.add_patch(Rectangle((x0 + i + 0.06, 0.06), 0.88, 0.88, facecolor=face,
                                       edgecolor="white"))
                ax.text(x0 + i + 0.5, 0.5, str(r), ha="center", va="center", fontsize=11,
                        fontweight="bold")
        verdict = "every TP group crosses the node boundary" if crosses else \
            "each TP group sits inside one node"
        ax.set_title(f"{title}: colour = TP group; {verdict}", fontsize=10.5)
        ax.set_xlim(-0.3, nodes * (gpus_per_node + 0.8))
        ax.set_ylim(1.6, -0.2)
        ax.set_aspect("equal")
        ax.axis("off")
    return fig


def dgx_h100():
    """One DGX H100: 8 GPUs on 4 NVSwitch chips, one 400 Gb/s NIC per GPU (NVIDIA DGX H100 guide)."""
    fig, ax = _figure(11, 5.2)
    for i in range(8):
        _block(ax, i * 1.35, 4, 1.15, 0.9, f"H100\nGPU {i}", viz.rank_color(0), "white", fs=9)
        _block(ax, i * 1.35, 0, 1.15, 0.7, "CX-7\n400 Gb/s", "#8c564b", "white", fs=8)
        ax.plot([i * 1.35 + 0.575] * 2, [0.7, 4], color="#8c564b", lw=1, ls=":")
    for k in range(4):
        x = 0.9 + k * 2.6
        _block(ax, x, 2.0, 1.6, 0.8, "NVSwitch", "#59a14f", "white", fs=9)
        for i in range(8):
            ax.plot([i * 1.35 + 0.575, x + 0.8], [4, 2.8], color="#59a14f", lw=0.6, alpha=0.6)
    ax.text(11.0, 3.4, "NVLink 4: 18 links per GPU\n900 GB/s per GPU (both\ndirections together),\n"
            "450 GB/s each way", fontsize=10, va="center")
    ax.text(11.0, 0.35, "to other nodes:\n8 × 400 Gb/s = 8 × 50 GB/s\nabout 50 GB/s per GPU,\n"
            "9× less than NVLink", fontsize=10, va="center")
    ax.set_xlim(-0.2, 14.2)
    ax.set_ylim(-0.3, 5.2)
    ax.axis("off")
    ax.set_title("DGX H100: what is fast (inside the node) and what is not (between nodes)",
                 fontsize=12)
    return fig


def four_axes():
    """What each axis splits, on 2 GPUs: the batch, each layer, the layers, the training state."""
    c0, c1 = viz.rank_color(0), viz.rank_color(1)
    fig, axes = plt.subplots(1, 4, figsize=(13, 4.2), layout="constrained")
    plt.close(fig)

    def model(ax, x, colors, label_of=lambda i: f"layer {i}", widths=None):
        for i in range(4):
            w = (widths or [1.6] * 4)[i]
            _block(ax, x, 3 - i * 0.8, w, 0.65, label_of(i), colors[i], "white", fs=8)

    titles = ["data parallel: split the batch", "tensor parallel: split each layer",
              "pipeline parallel: split the layers", "sharding: split the training state"]
    notes = ["all-reduce the gradients\nonce per step", "2 all-reduces per layer forward,\n2 backward (activations)",
             "send activations to the\nnext stage per micro-batch", "all-gather weights before use,\n"
             "reduce-scatter gradients"]
    for ax, title, note in zip(axes, titles, notes):
        ax.set_title(title, fontsize=10.5)
        ax.text(1.9, -0.05, note, ha="center", va="top", fontsize=9.5)
        ax.set_xlim(-0.2, 4.0)
        ax.set_ylim(-1.1, 4.2)
        ax.axis("off")
    model(axes[0], 0, [c0] * 4)
    model(axes[0], 2.1, [c1] * 4)
    for i in range(4):
        _block(axes[1], 0.3, 3 - i * 0.8, 1.5, 0.65, f"L{i} ½", c0, "white", fs=8)
        _block(axes[1], 1.8, 3 - i * 0.8, 1.5, 0.65, f"L{i} ½", c1, "white", fs=8)
    model(axes[2], 1.1, [c0, c0, c1, c1])
    axes[2].text(1.0, 2.9, "GPU 0", ha="right", va="center", color=c0, fontsize=9, fontweight="bold")
    axes[2].text(1.0, 1.3, "GPU 1", ha="right", va="center", color=c1, fontsize=9, fontweight="bold")
    for i, name in enumerate(("weights", "gradients", "optimizer")):
        _block(axes[3], 0.1, 3 - i * 1.1, 1.75, 0.8, f"{name} ½", c0, "white", fs=8)
        _block(axes[3], 1.95, 3 - i * 1.1, 1.75, 0.8, f"{name} ½", c1, "white", fs=8)
    axes[3].text(1.9, 0.45, "each GPU: 16Ψ/N bytes", ha="center", fontsize=9)
    for ax, (left, right) in zip((axes[0], axes[1], axes[3]), ((0.8, 2.9), (1.05, 2.55), (0.97, 2.82))):
        head = " · batch ½" if ax is axes[0] else ""
        ax.text(left, 3.85, "GPU 0" + head, ha="center", color=c0, fontsize=9, fontweight="bold")
        ax.text(right, 3.85, "GPU 1" + head, ha="center", color=c1, fontsize=9, fontweight="bold")
    return fig


FIGURES = {
    "zero_stages": zero_stages,
    "ring_allreduce": ring_allreduce,
    "tp_splits": tp_splits,
    "pipeline_schedules": pipeline_schedules,
    "busbw_model": busbw_model,
    "decision_chart": decision_chart,
    "mesh_on_nodes": mesh_on_nodes,
    "dgx_h100": dgx_h100,
    "four_axes": four_axes,
    **planner_figures.FIGURES,  # the scenarios and the calculator, from parlab.planner
    **context_expert_figures.FIGURES,  # lab 07's CP and EP: activations, the ring, balance, all-to-all
    **real_config_figures.FIGURES,  # lab 08: a checkpoint saved on 3 ranks, loaded on 2 and 4
}


def render(folder: str) -> list[str]:
    """Draw every figure in FIGURES into ``folder``; returns the paths written."""
    os.makedirs(folder, exist_ok=True)
    paths = []
    for name, draw in FIGURES.items():
        path = os.path.join(folder, f"{name}.png")
        draw().savefig(path, dpi=DPI)
        paths.append(path)
    return paths
