"""An interactive memory and time calculator for a parallel layout, on ipywidgets.

    from parlab.calculator import calculator
    calculator()                      # starts on "7B on 8 H100s"
    calculator("70B on 64 H100s")     # any name in parlab.planner.SCENARIOS

Sliders set the model, the cluster and the plan (tp, cp, pp, ZeRO stage,
micro-batch, recomputation "none"/"selective"/"full"; dp = GPUs / (cp·tp·pp)
and the accumulation steps follow from the global batch: each replica takes
global_batch / dp rows, which the micro-batch must divide).  A scenario keeps
its model's vocabulary, FFN width and K/V heads and its cluster's links and
presets; the sliders change the rest.  Every change redraws the memory of the
busiest GPU (the busiest pipeline stage), split into weights, gradients,
optimizer states and activations, against the GPU's capacity and the share of
it a plan may use (``Cluster.headroom``), and lists the predicted step time by
part (compute, then each of bubble, TP, CP, PP, EP, DP, the calibrated model's memory-bound kernels and
optimizer step, and the MFU cap that is not zero), throughput and time to train, or every
reason the layout cannot run.  "Best plan" sets the sliders to
``planner.search``'s answer.  The numbers are ``parlab.planner``'s model (see
its docstring for what it counts and what it leaves out).

``report(plan, work)`` is the same output without widgets: a figure and an
HTML summary, for the slides and the tests.
"""
from __future__ import annotations

import html

from dataclasses import replace

from . import planner
from .planner import Plan, Workload

__all__ = ["calculator", "report", "Calculator"]

KIND_COLORS = {  # one colour per kind of memory, shared with the slides
"weights": "#4c72b0", "grads": "#dd8452", "optimizer": "#55a868", "activations": "#c44e52"}
# the step's parts after compute, each shown when it is not zero (planner.step_time): the calibrated model's
# memory-bound kernels and optimizer step, and the time the MFU cap adds (planner.capped_time)
STEP_PARTS = (("memory", "memory-bound"), ("bubble", "bubble"), ("tp", "TP"), ("cp", "CP"), ("pp", "PP"),
              ("ep", "EP"), ("dp", "DP"), ("optimizer", "optimizer step"), ("cap", "MFU cap"))


def _with(options: list, value) -> list:
    """``options`` with ``value`` added in order, so a slider can start on any value."""
    return sorted(set(options) | {value})


def _days(seconds: float) -> str:
    return f"{seconds / 86400:,.1f} days" if seconds >= 86400 else f"{seconds / 3600:,.1f} hours"


def report(plan: Plan, work: Workload):
    """(matplotlib Figure, HTML text) for ``plan`` on ``work``: memory bars and the predictions."""
    import matplotlib.pyplot as plt

    try:
        guess = planner.predict(plan, work)
        memory, problems, t = guess.memory, guess.problems, guess.time
    except ValueError:  # a plan that cannot exist on this cluster: no time, but every reason
        guess, t = None, None
        memory, problems = planner.memory_breakdown(plan, work.model), tuple(planner.problems(plan, work))
    fits = not problems
    fig, ax = plt.subplots(figsize=(7.5, 2.3))
    left = 0.0
    for kind, value in memory.items():
        ax.barh([0], [value / 1e9], left=left, color=KIND_COLORS[kind], label=f"{kind} {value / 1e9:.1f}")
        left += value / 1e9
    cap = work.cluster.memory / 1e9
    ax.axvline(cap, color="black", lw=2, ls="--")
    ax.text(cap, 0.45, f" {cap:.0f} GB per GPU", va="bottom", ha="left" if left < cap * 1.4 else "right")
    usable = work.cluster.usable_memory / 1e9
    if usable < cap:
        ax.axvline(usable, color="grey", lw=1.5, ls=":")
        ax.text(usable, -0.45, f"{work.cluster.headroom:.0%} ", va="top", ha="right", fontsize=8, color="grey")
    ax.set_yticks([])
    ax.set_xlim(0, max(cap, left) * 1.15)
    ax.set_xlabel("GB on the busiest GPU (its pipeline stage holds the most)")
    ax.set_title(f"{work.model.name}: {plan}", fontsize=10)
    ax.legend(ncol=4, fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.75), frameon=False)
    for side in ("top", "right", "left"):
        ax.spines[side].set_visible(False)
    fig.subplots_adjust(left=0.03, right=0.97, top=0.82, bottom=0.42)
    lines = [f"<b>{'fits' if fits else 'does not fit'}</b>: {sum(memory.values()) / 1e9:.1f} GB "
             f"on the busiest GPU, of the {usable:.0f} GB a plan may use ({work.cluster.headroom:.0%} of "
             f"{cap:.0f} GB)"]
    if t is not None:
        parts = "".join(f" + {label} {t[key]:.2f}" for key, label in STEP_PARTS if t[key] > 0)
        lines.append(f"step {t['total']:.2f} s = compute {t['compute']:.2f}{parts}")
        lines.append(f"{guess.tokens_per_second:,.0f} tokens/s (communication counted where it is exposed)")
    if t is not None and work.tokens:
        lines.append(f"time to train on {work.tokens:.3g} tokens: "
                     f"{_days(planner.time_to_train(plan, work))}")
    lines += [f"<span style='color:#c0392b'>✗ {html.escape(p)}</span>" for p in problems]
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
        self.cp = slider(w.SelectionSlider, "cp", options=[1, 2, 4, 8, 16], value=1)
        self.pp = slider(w.SelectionSlider, "pp", options=list(range(1, 65)), value=1)
        self.zero = w.ToggleButtons(options=[0, 1, 2, 3], value=0, description="ZeRO stage",
                                    style={**style, "button_width": "44px"})
        self.micro = slider(w.SelectionSlider, "micro-batch", options=[2 ** k for k in range(0, 9)], value=1)
        self.recompute = w.ToggleButtons(options=list(planner.RECOMPUTE), value="none",
                                         description="recompute", style={**style, "button_width": "72px"})
        self.best = w.Button(description="Best plan", button_style="primary")
        self.summary = w.HTML()
        self.plot = w.Output()
        self.last_figure = None
        self._quiet = False
        inputs = [self.params, self.layers, self.hidden, self.heads, self.seq, self.gpus, self.per_node,
                  self.memory, self.batch, self.tokens, self.tp, self.cp, self.pp, self.zero, self.micro,
                  self.recompute]
        for widget in inputs:
            widget.observe(lambda change: self.update(), names="value")
        self.scenario.observe(lambda change: self.load(change["new"]), names="value")
        self.best.on_click(lambda button: self.choose_best())
        model_box = w.VBox([w.HTML("<b>Model</b>"), self.params, self.layers, self.hidden, self.heads, self.seq])
        cluster_box = w.VBox([w.HTML("<b>Cluster and run</b>"), self.gpus, self.per_node, self.memory,
                              self.batch, self.tokens])
        plan_box = w.VBox([w.HTML("<b>Plan</b> (dp = GPUs / (cp·tp·pp))"), self.tp, self.cp, self.pp, self.zero,
                           self.micro, self.recompute, self.best])
        columns = w.HBox([model_box, cluster_box, plan_box], layout=w.Layout(flex_flow="row wrap"))
        self.box = w.VBox([self.scenario, columns, self.plot, self.summary])
        self.base = work  # the model's vocabulary, FFN, K/V heads and the cluster's links
        self._pipeline, self._pipeline_pp = (1, ()), 0  # the search's (v, stages) and its pp
        self.choose_best()

    def _ipython_display_(self) -> None:
        from IPython.display import display

        display(self.box)

    # ------------------------------------------------------------ reading and writing the widgets
    def workload(self) -> Workload:
        """The sliders' workload: the starting one's model and cluster with the sliders' values.

        Raises ValueError when the sliders describe a model that cannot exist (for example fewer
        parameters than its embedding and output layer)."""
        base = self.base
        name = base.model.name if self.scenario.value == "(custom)" else self.scenario.value.split()[0]
        model = replace(base.model, name=name, params=self.params.value, layers=self.layers.value,
                        hidden=self.hidden.value, heads=self.heads.value, seq=self.seq.value)
        if model.kv_heads and model.heads % model.kv_heads:
            model = replace(model, kv_heads=0)
        cluster = replace(base.cluster, gpus=self.gpus.value, gpus_per_node=self.per_node.value,
                          memory=self.memory.value * 1e9)
        return replace(base, model=model, cluster=cluster, global_batch=self.batch.value,
                       tokens=self.tokens.value)

    def plan(self, work: Workload) -> tuple[Plan | None, str]:
        """The plan the sliders describe, or None and why it cannot be formed."""
        tp, cp, pp = self.tp.value, self.cp.value, self.pp.value
        if work.cluster.gpus % (tp * cp * pp):
            what = f"cp·tp·pp = {cp * tp * pp}" if cp > 1 else f"tp·pp = {tp * pp}"
            return None, f"{what} does not divide the {work.cluster.gpus} GPUs"
        dp = work.cluster.gpus // (tp * cp * pp)
        if work.global_batch % (dp * self.micro.value):
            return None, (f"dp·micro-batch = {dp}·{self.micro.value} does not divide the global batch "
                          f"of {work.global_batch}: the micro-batch must divide a replica's "
                          f"global_batch / dp rows")
        # The search's own plan may interleave (v chunks per rank) or split the layers unevenly;
        # there is no slider for either, so they are kept while pp stays the search's pp.
        v, stages = self._pipeline if pp == self._pipeline_pp else (1, ())
        return Plan(dp=dp, tp=tp, pp=pp, cp=cp, zero=self.zero.value if dp * cp > 1 else 0,
                    micro_batch=self.micro.value, accum=work.global_batch // (dp * self.micro.value),
                    recompute=self.recompute.value, v=v, stages=stages, precision=work.precision), ""

    def load(self, name: str) -> None:
        if name not in planner.SCENARIOS:
            return
        work = planner.SCENARIOS[name]
        self.base = work
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
        try:
            work = self.workload()
        except ValueError:
            self.update()
            return
        found = planner.search(work)
        self._pipeline, self._pipeline_pp = (1, ()), 0
        if found is not None and found.plan.tp in self.tp.options and found.plan.pp in self.pp.options \
                and found.plan.cp in self.cp.options and found.plan.micro_batch in self.micro.options:
            self._quiet = True
            try:
                p = found.plan
                self._pipeline, self._pipeline_pp = (p.v, p.stages), p.pp
                self.tp.value, self.cp.value, self.pp.value, self.zero.value = p.tp, p.cp, p.pp, p.zero
                self.micro.value, self.recompute.value = p.micro_batch, p.recompute
            finally:
                self._quiet = False
        self.update(nothing_fits=found is None)

    def update(self, nothing_fits: bool = False) -> None:
        if self._quiet:
            return
        import matplotlib.pyplot as plt
        from IPython.display import display

        try:
            work = self.workload()
        except ValueError as bad:
            work, plan, why_not = None, None, str(bad)
        else:
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
