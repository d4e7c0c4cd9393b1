"""An interactive memory and time calculator for a parallel layout, on ipywidgets.

    from parlab.calculator import calculator
    calculator()                      # starts on "7B on 8 H100s"
    calculator("70B on 64 H100s")     # any name in parlab.planner.SCENARIOS

Sliders set the model, the cluster and the plan (tp, pp, ZeRO stage,
micro-batch, recomputation; dp = GPUs / (tp·pp) and the accumulation steps
follow from the global batch).  Every change redraws the memory per GPU,
split into weights, gradients, optimizer states and activations, against the
GPU's capacity, and lists the predicted step time, throughput and time to
train, or every reason the layout cannot run.  "Best plan" sets the sliders to
``planner.search``'s answer.  The numbers are ``parlab.planner``'s model (see
its docstring for what it counts and what it leaves out).

``report(plan, work)`` is the same output without widgets: a figure and an
HTML summary, for the slides and the tests.
"""
from __future__ import annotations

import html

from . import planner
from .planner import Cluster, ModelSpec, Plan, Workload

__all__ = ["calculator", "report", "Calculator"]

KIND_COLORS = {  # one colour per kind of memory, shared with the slides
"weights": "#4c72b0", "grads": "#dd8452", "optimizer": "#55a868", "activations": "#c44e52"}


def _with(options: list, value) -> list:
    """``options`` with ``value`` added in order, so a slider can start on any value."""
    return sorted(set(options) | {value})


def _days(seconds: float) -> str:
    return f"{seconds / 86400:,.1f} days" if seconds >= 86400 else f"{seconds / 3600:,.1f} hours"


def report(plan: Plan, work: Workload):
    """(matplotlib Figure, HTML text) for ``plan`` on ``work``: memory bars and the predictions."""
    import matplotlib.pyplot as plt

    guess = planner.predict(plan, work)
    fig, ax = plt.subplots(figsize=(7.5, 2.3))
    left = 0.0
    for kind, value in guess.memory.items():
        ax.barh([0], [value / 1e9], left=left, color=KIND_COLORS[kind], label=f"{kind} {value / 1e9:.1f}")
        left += value / 1e9
    cap = work.cluster.memory / 1e9
    ax.axvline(cap, color="black", lw=2, ls="--")
    ax.text(cap, 0.45, f" {cap:.0f} GB per GPU", va="bottom", ha="left" if left < cap * 1.4 else "right")
    ax.set_yticks([])
    ax.set_xlim(0, max(cap, left) * 1.15)
    ax.set_xlabel("GB on the GPU that holds pipeline stage 0")
    ax.set_title(f"{work.model.name}: {plan}", fontsize=10)
    ax.legend(ncol=4, fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.75), frameon=False)
    for side in ("top", "right", "left"):
        ax.spines[side].set_visible(False)
    fig.subplots_adjust(left=0.03, right=0.97, top=0.82, bottom=0.42)
    t = guess.time
    lines = [f"<b>{'fits' if guess.fits else 'does not fit'}</b>: {sum(guess.memory.values()) / 1e9:.1f} GB "
             f"of {cap:.0f} GB per GPU",
             f"step {t['total']:.2f} s = compute {t['compute']:.2f} + TP {t['tp']:.2f} + PP {t['pp']:.2f} "
             f"+ DP {t['dp']:.2f}; {guess.tokens_per_second:,.0f} tokens/s"]
    if work.tokens:
        lines.append(f"time to train on {work.tokens:.3g} tokens: "
                     f"{_days(planner.time_to_train(plan, work))}")
    lines += [f"<span style='color:#c0392b'>✗ {html.escape(p)}</span>" for p in guess.problems]
    return fig, "<br>".join(lines)


class Calculator:
    """The widgets and their wiring; ``calculator()`` returns one's ``.box``."""

    def __init__(self, work: Workload):
        import ipywidgets as w

        style = {"description_width": "115px"}
        m, c = work.model, work.cluster

        def slider(kind, description, **kwargs):  # wide enough that the value shows beside it
            return kind(description=description, style=style, continuous_update=False,
                        layout=w.Layout(width="330px"), **kwargs)

        self.scenario = w.Dropdown(options=["(custom)"] + list(planner.SCENARIOS), value="(custom)",
                                   description="scenario", style=style)
        self.params = slider(w.FloatLogSlider, "parameters", base=10, min=8, max=12, step=0.01,
                             value=m.params, readout_format=".3g")
        self.layers = slider(w.IntSlider, "layers", min=1, max=160, value=m.layers)
        self.hidden = slider(w.IntSlider, "hidden size", min=256, max=32768, step=256, value=m.hidden)
        self.heads = slider(w.IntSlider, "attention heads", min=1, max=256, value=m.heads)
        self.seq = slider(w.SelectionSlider, "sequence length",
                          options=_with([2 ** k for k in range(8, 18)], m.seq), value=m.seq)
        self.gpus = slider(w.SelectionSlider, "GPUs", options=_with([2 ** k for k in range(0, 15)], c.gpus),
                           value=c.gpus)
        self.per_node = slider(w.IntSlider, "GPUs per node", min=1, max=16, value=c.gpus_per_node)
        self.memory = slider(w.FloatSlider, "GB per GPU", min=16, max=288, step=1, value=c.memory / 1e9)
        self.batch = slider(w.SelectionSlider, "global batch", options=_with([2 ** k for k in range(0, 14)], work.global_batch),
                            value=work.global_batch)
        self.tokens = slider(w.FloatLogSlider, "tokens to train", base=10, min=9, max=14, step=0.01,
                             value=work.tokens or 1e12, readout_format=".3g")
        self.tp = slider(w.SelectionSlider, "tp", options=list(range(1, 17)), value=1)
        self.pp = slider(w.SelectionSlider, "pp", options=list(range(1, 65)), value=1)
        self.zero = w.ToggleButtons(options=[0, 1, 2, 3], value=0, description="ZeRO stage",
                                    style={**style, "button_width": "44px"})
        self.micro = slider(w.SelectionSlider, "micro-batch", options=[2 ** k for k in range(0, 9)], value=1)
        self.recompute = w.Checkbox(value=False, description="recompute activations")
        self.best = w.Button(description="Best plan", button_style="primary")
        self.summary = w.HTML()
        self.plot = w.Output()
        self.last_figure = None
        self._quiet = False
        inputs = [self.params, self.layers, self.hidden, self.heads, self.seq, self.gpus, self.per_node,
                  self.memory, self.batch, self.tokens, self.tp, self.pp, self.zero, self.micro,
                  self.recompute]
        for widget in inputs:
            widget.observe(lambda change: self.update(), names="value")
        self.scenario.observe(lambda change: self.load(change["new"]), names="value")
        self.best.on_click(lambda button: self.choose_best())
        model_box = w.VBox([w.HTML("<b>Model</b>"), self.params, self.layers, self.hidden, self.heads, self.seq])
        cluster_box = w.VBox([w.HTML("<b>Cluster and run</b>"), self.gpus, self.per_node, self.memory,
                              self.batch, self.tokens])
        plan_box = w.VBox([w.HTML("<b>Plan</b> (dp = GPUs / (tp·pp))"), self.tp, self.pp, self.zero,
                           self.micro, self.recompute, self.best])
        columns = w.HBox([model_box, cluster_box, plan_box], layout=w.Layout(flex_flow="row wrap"))
        self.box = w.VBox([self.scenario, columns, self.plot, self.summary])
        self.choose_best()

    def _ipython_display_(self) -> None:
        from IPython.display import display

        display(self.box)

    # ------------------------------------------------------------ reading and writing the widgets
    def workload(self) -> Workload:
        model = ModelSpec("custom" if self.scenario.value == "(custom)" else self.scenario.value.split()[0],
                          self.params.value, self.layers.value, self.hidden.value, self.heads.value,
                          self.seq.value)
        cluster = Cluster(self.gpus.value, gpus_per_node=self.per_node.value, memory=self.memory.value * 1e9)
        return Workload(model, cluster, self.batch.value, tokens=self.tokens.value)

    def plan(self, work: Workload) -> tuple[Plan | None, str]:
        """The plan the sliders describe, or None and why it cannot be formed."""
        tp, pp = self.tp.value, self.pp.value
        if work.cluster.gpus % (tp * pp):
            return None, f"tp·pp = {tp * pp} does not divide the {work.cluster.gpus} GPUs"
        dp = work.cluster.gpus // (tp * pp)
        if work.global_batch % (dp * self.micro.value):
            return None, (f"dp·micro-batch = {dp}·{self.micro.value} does not divide the global batch "
                          f"of {work.global_batch}")
        return Plan(dp=dp, tp=tp, pp=pp, zero=self.zero.value if dp > 1 else 0,
                    micro_batch=self.micro.value, accum=work.global_batch // (dp * self.micro.value),
                    recompute=self.recompute.value), ""

    def load(self, name: str) -> None:
        if name not in planner.SCENARIOS:
            return
        work = planner.SCENARIOS[name]
        self._quiet = True
        try:
            m, c = work.model, work.cluster
            self.params.value, self.layers.value, self.hidden.value = m.params, m.layers, m.hidden
            self.heads.value, self.seq.value = m.heads, m.seq
            self.gpus.value, self.per_node.value, self.memory.value = c.gpus, c.gpus_per_node, c.memory / 1e9
            self.batch.value = work.global_batch
            if work.tokens:
                self.tokens.value = work.tokens
        finally:
            self._quiet = False
        self.choose_best()

    def choose_best(self) -> None:
        work = self.workload()
        found = planner.search(work)
        if found is not None and found.plan.tp in self.tp.options and found.plan.pp in self.pp.options \
                and found.plan.micro_batch in self.micro.options:
            self._quiet = True
            try:
                p = found.plan
                self.tp.value, self.pp.value, self.zero.value = p.tp, p.pp, p.zero
                self.micro.value, self.recompute.value = p.micro_batch, p.recompute
            finally:
                self._quiet = False
        self.update(nothing_fits=found is None)

    def update(self, nothing_fits: bool = False) -> None:
        if self._quiet:
            return
        import matplotlib.pyplot as plt
        from IPython.display import display

        work = self.workload()
        plan, why_not = self.plan(work)
        note = ("<br><b>No layout fits this model on this cluster.</b>" if nothing_fits else "")
        with self.plot:
            self.plot.clear_output(wait=True)
            if plan is None:
                self.last_figure = None
                self.summary.value = f"<span style='color:#c0392b'>✗ {html.escape(why_not)}</span>" + note
                return
            fig, text = report(plan, work)
            self.last_figure = fig
            display(fig)
            plt.close(fig)
        self.summary.value = text + note


def calculator(start: str | Workload = "7B on 8 H100s") -> Calculator:
    """The calculator (it displays as its widgets), from a scenario name or a ``planner.Workload``."""
    if isinstance(start, str):
        if start not in planner.SCENARIOS:
            raise ValueError(f"unknown scenario {start!r}; choose one of {list(planner.SCENARIOS)}")
        calc = Calculator(planner.SCENARIOS[start])
        calc.scenario.value = start
        return calc
    if not isinstance(start, Workload):
        raise TypeError(f"start must be a scenario name or a planner.Workload, got {type(start).__name__}")
    return Calculator(start)
