"""The lecture's context- and expert-parallelism figures (lab 07), from parlab at build time.

``cp_activations`` is ``cost.activation_bytes_per_layer`` (Korthikanti et al.
2022, Table 2, the formula the planner uses) for the planner's 7B and 70B models
with s/cp tokens per GPU; ``ring_steps`` the exact ring schedule of lab 07's
exercise 1; ``causal_balance`` is ``parlab.viz.causal_work`` on the plain and
zig-zag layouts of lab 07's checker (``parlab.grading.lab07.ring.layout_positions``);
``ep_dispatch`` routes two ranks' tokens with ``parlab.models.moe.route`` (lab 07's
MoE) and draws what each all-to-all sends.  None is a measurement: lab 07
measures the times and the bytes.
"""
from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402
from matplotlib.patches import Rectangle  # noqa: E402

from parlab import cost, planner, viz  # noqa: E402
from parlab.grading.lab07.ring import layout_positions  # noqa: E402
from parlab.models.moe import route, tiny_moe  # noqa: E402

GB = 1e9
LONG_SCENARIO = "7B, 32k-token sequences (64 H100s)"  # its model: Llama-2-7B's shape at s = 32k
BIG_SCENARIO = "70B on 64 H100s"
SEQ = [2 ** k for k in range(12, 21)]  # 4k .. 1M tokens
CPS = (1, 2, 4, 8, 16)
BALANCE = dict(s=32, c=4)  # the causal-balance picture: 4 ranks, 8 tokens each
EP = dict(ranks=2, tokens=4, d=8, experts=4, top_k=2, seed=3)


def activations_gb(model: planner.ModelSpec, s: int, cp: int, tp: int) -> float:
    """Every layer's activations per GPU, b = 1, with s/cp tokens, FlashAttention, SP when tp > 1."""
    per_layer = cost.activation_bytes_per_layer(s / cp, 1, model.hidden, model.heads, t=tp, sp=tp > 1,
                                                scores=model.scores, **model.shape)
    return model.layers * per_layer / GB


CP_PANELS = ((LONG_SCENARIO, 1), (BIG_SCENARIO, 8))  # (scenario whose model is drawn, tp)


def cp_activations():
    """Activations per GPU against the sequence length for cp = 1..16 (formula, not measured)."""
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.4), layout="constrained", sharey=True)
    plt.close(fig)
    for ax, (scenario, tp) in zip(axes, CP_PANELS):
        model = planner.SCENARIOS[scenario].model
        for i, cp in enumerate(CPS):
            ax.plot(SEQ, [activations_gb(model, s, cp, tp) for s in SEQ], marker="o", ms=3,
                    color=viz.rank_color(i), label=f"cp = {cp}")
        ax.axhline(cost.H100_MEMORY / GB, color="#c0392b", ls="--", lw=1.4)
        ax.text(SEQ[0], cost.H100_MEMORY / GB * 1.1, "one H100: 80 GB", color="#c0392b", fontsize=9)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks(SEQ, [f"{s // 1024}k" for s in SEQ])
        setting = "no TP" if tp == 1 else f"TP {tp} + SP"
        ax.set_title(f"{model.name}, {model.layers} layers, {setting}", fontsize=10.5)
        ax.set_xlabel("sequence length s (tokens)")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("activations per GPU (GB)")
    axes[1].legend(fontsize=9, frameon=False, loc="upper left")
    fig.suptitle("activations of every layer, one sequence, FlashAttention, s/cp tokens per GPU "
                 "(Korthikanti et al. 2022, Table 2, with each model's MLP width)", fontsize=10.5)
    return fig


def ring_steps(c: int = 4):
    """Which K/V chunk each rank computes on at each step of lab 07's ring (exact schedule)."""
    fig, ax = plt.subplots(figsize=(10, 3.6), layout="constrained")
    plt.close(fig)
    for r in range(c):
        ax.text(-0.15, r + 0.5, f"rank {r}: Q{r}", ha="right", va="center", fontsize=10,
                color=viz.rank_color(r), fontweight="bold")
        for step in range(c):
            j = (r - step) % c  # lab 07, exercise 1: at step i rank r holds rank (r − i) mod c's chunk
            ax.add_patch(Rectangle((step * 1.5 + 0.05, r + 0.08), 1.3, 0.84, facecolor=viz.rank_color(j),
                                   edgecolor="white"))
            ax.text(step * 1.5 + 0.7, r + 0.5, f"Q{r}·K{j}ᵀ, V{j}", ha="center", va="center",
                    fontsize=9.5, color="white", fontweight="bold")
            if step < c - 1:
                ax.annotate("", xy=(step * 1.5 + 1.55, (r + 1) % c + 0.5 if r < c - 1 else 0.15),
                            xytext=(step * 1.5 + 1.3, r + 0.5),
                            arrowprops=dict(arrowstyle="-|>", color="#777777", lw=0.8))
    for step in range(c):
        ax.text(step * 1.5 + 0.7, -0.1, f"step {step}", ha="center", va="bottom", fontsize=10)
    ax.set_xlim(-1.6, c * 1.5 + 0.1)
    ax.set_ylim(c + 0.1, -0.5)
    ax.axis("off")
    ax.set_title(f"ring attention, c = {c}: each rank keeps its queries; at step i it computes on the K/V "
                 "chunk of rank (r − i) mod c\nwhile that chunk is already on its way to rank r + 1 (arrows)",
                 fontsize=10.5)
    return fig


def balance_layouts() -> dict:
    s, c = BALANCE["s"], BALANCE["c"]
    return {"plain split": layout_positions(s, c, "contiguous"), "zig-zag split": layout_positions(s, c, "zigzag")}


def causal_balance():
    s, c = BALANCE["s"], BALANCE["c"]
    return viz.causal_work(balance_layouts(), title=f"causal attention, s = {s} tokens on c = {c} ranks: "
                                                     "the pairs each rank computes (counted, not measured)")


def ep_routing() -> list[dict]:
    """Lab 07's MoE routing of each rank's tokens: per rank, its assignments sorted by expert."""
    n, per = EP["ranks"], EP["experts"] // EP["ranks"]
    moe = tiny_moe(EP["d"], 2 * EP["d"], EP["experts"], EP["top_k"], seed=EP["seed"])
    out = []
    for rank in range(n):
        x = torch.randn(EP["tokens"], EP["d"], generator=torch.Generator().manual_seed(100 + rank),
                        dtype=torch.float64)
        expert, _, _ = route(moe.router, x, EP["top_k"])
        token = torch.arange(EP["tokens"]).repeat_interleave(EP["top_k"])
        chosen = expert.reshape(-1)
        order = torch.argsort(chosen, stable=True)
        rows = [(int(token[i]), int(chosen[i])) for i in order]
        out.append({"rows": rows, "to": [sum(1 for _, e in rows if e // per == j) for j in range(n)]})
    return out


def ep_dispatch():
    """Dispatch and combine of lab 07's expert-parallel layer on 2 ranks, from real routing."""
    n, per = EP["ranks"], EP["experts"] // EP["ranks"]
    routing = ep_routing()
    letters = "abcdefgh"
    sends = [[(rank, t, e) for t, e in routing[rank]["rows"]] for rank in range(n)]
    gets = [[(src, t, e) for src in range(n) for t, e in routing[src]["rows"] if e // per == rank]
            for rank in range(n)]
    longest = max(len(r) for r in sends + gets)
    width = min(0.62, 5.4 / longest)
    x_send, x_get = 1.5, 1.5 + width * max(len(r) for r in sends) + 2.6
    fig, ax = plt.subplots(figsize=(11.5, 3.6), layout="constrained")
    plt.close(fig)

    def row(x0, y, cells, label):
        ax.text(x0 - 0.12, y + 0.35, label, ha="right", va="center", fontsize=9.5)
        for i, (src, t, e) in enumerate(cells):
            ax.add_patch(Rectangle((x0 + i * width, y), width - 0.04, 0.7, facecolor=viz.rank_color(e // per),
                                   edgecolor="white"))
            ax.text(x0 + i * width + width / 2 - 0.02, y + 0.35, f"{letters[src]}{t}\ne{e}", ha="center",
                    va="center", fontsize=7.5, color="white", fontweight="bold")

    for rank in range(n):
        y = rank * 1.5
        row(x_send, y, sends[rank], f"rank {rank} sends")
        row(x_get, y, gets[rank], f"rank {rank} gets")
        counts = routing[rank]["to"]
        ax.text(x_send, y + 0.8, f"counts first: {counts} rows to ranks {list(range(n))}", fontsize=8.5,
                va="top")
    mid = (x_send + width * max(len(r) for r in sends) + x_get) / 2
    ax.annotate("", xy=(x_get - 1.3, 1.1), xytext=(mid - 0.75, 1.1),
                arrowprops=dict(arrowstyle="-|>", lw=2, color="#333333"))
    ax.text(mid - 0.4, 0.98, "dispatch: all-to-all", ha="center", va="bottom", fontsize=9.5, fontweight="bold")
    ax.text(mid - 0.4, 1.22, "combine: the same, reversed", ha="center", va="top", fontsize=9)
    ax.set_xlim(-0.2, x_get + width * longest + 0.2)
    ax.set_ylim(2.45, -0.3)
    ax.axis("off")
    ax.set_title(f"{EP['tokens']} tokens per rank (a0.. on rank 0, b0.. on rank 1), top-{EP['top_k']} of "
                 f"{EP['experts']} experts, e0–e{per - 1} on rank 0: each assignment row travels to its "
                 "expert's rank (colour)", fontsize=10)
    return fig


FIGURES = {
    "cp_activations": cp_activations,
    "ring_steps": ring_steps,
    "causal_balance": causal_balance,
    "ep_dispatch": ep_dispatch,
}
