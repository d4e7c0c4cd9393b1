"""The lecture's scenario figures, drawn from ``parlab.planner`` and ``parlab.calculator``.

``scenario_rows()`` asks ``planner_band.band`` for the layouts of every
scenario in ``planner.SCENARIOS`` that are predicted within the planner's error
on published runs of the fastest (the band), and ``planner.search`` for the
fastest; ``scenario_plans()`` draws them: how many layouts the band holds, the
fastest one's memory per GPU stacked by kind against the GPU's capacity, its
plan, its predicted tokens/s and, where the scenario has a token budget, the
days to train.  The fastest is one plan of the band, not the answer.  For
a scenario where nothing fits it draws the candidate plan that needs the
least memory, hatched, and says why none fits (``planner.infeasible``).  ``calculator_report()`` is
``parlab.calculator.report`` for the plan the calculator starts on, with its
text drawn under the bars.  These are predictions of planner v3's model (GEMMs
at ``Cluster.efficiency`` of peak times a shape factor, the MFU under ``Cluster.best_mfu``
(``planner.capped_time``), each axis's traffic
overlapped where Megatron-LM/FSDP overlap it, a latency per collective, plans
within ``Cluster.headroom`` of HBM; see its docstring for what it leaves out),
not measurements.
"""
from __future__ import annotations

import html
import re
from dataclasses import dataclass

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402

from parlab import cost, planner, planner_band  # noqa: E402
from parlab.calculator import KIND_COLORS  # noqa: E402  (the calculator's colours, so both slides read alike)
from parlab.calculator import report  # noqa: E402

GB = 1e9
KINDS = ("weights", "grads", "optimizer", "activations")
CALCULATOR_SCENARIO = "70B on 64 H100s"  # what the slide starts the calculator on
TEXT_X = 0.1  # where the side's plan text starts, right of the band's count
COUNT_X = 0.08  # where the band's count ends
MEMORY_REASON = "needs more memory per GPU than a plan may use"  # planner.infeasible's key for memory


@dataclass(frozen=True)
class ScenarioRow:
    """One scenario: its workload, its band and best prediction, or (nothing fits) the least-memory
    candidate."""

    name: str
    work: planner.Workload
    best: planner.Prediction | None
    closest: planner.Prediction | None = None  # only when best is None
    band: planner_band.Band | None = None  # the layouts within the error band; None when nothing fits

    @property
    def shown(self) -> planner.Prediction:
        return self.best if self.best is not None else self.closest

    @property
    def days(self) -> float | None:
        if self.best is None or not self.work.tokens:
            return None
        return planner.time_to_train(self.best.plan, self.work) / cost.SECONDS_PER_DAY


def closest_candidate(work: planner.Workload) -> planner.Prediction:
    """The candidate plan whose only problem is memory and that needs the least of it."""
    if MEMORY_REASON not in planner.infeasible(work):
        raise ValueError(f"no candidate plan for {work.model.name} on {work.cluster.gpus} GPUs fails "
                         "on memory: check the workload's shape (heads, layers, batch)")
    memory_only = [p for p in planner.candidates(work)
                   if [q for q in planner.problems(p, work) if "GB per GPU" not in q] == []]
    if not memory_only:
        raise ValueError(f"no candidate plan for {work.model.name} on {work.cluster.gpus} GPUs fails "
                         "on memory alone; check the workload's shape (heads, layers, batch)")
    plan = min(memory_only, key=lambda p: planner.memory_per_gpu(p, work.model))
    return planner.predict(plan, work)


def scenario_rows() -> list[ScenarioRow]:
    rows = []
    for name, work in planner.SCENARIOS.items():
        best = planner.search(work)
        rows.append(ScenarioRow(name, work, best, None if best is not None else closest_candidate(work),
                                planner_band.band(work)))
    return rows


def _row_text(row: ScenarioRow) -> tuple[str, str]:
    """(first line, second line) of the column beside the bars."""
    c = row.work.cluster
    if row.best is None:
        reasons = planner.infeasible(row.work)
        states = cost.model_state_bytes(row.work.model.params, 1, 0, row.work.precision)
        total = c.gpus * c.memory
        if states > total:
            why = f"{states / GB:,.0f} GB of model states > {total / GB:,.0f} GB on {c.gpus} GPUs"
        elif list(reasons) == [MEMORY_REASON]:
            why = f"every layout needs more than {c.usable_memory / GB:.0f} GB per GPU"
        else:
            why = "; ".join(reasons)
        return f"nothing fits: {why}", f"closest: {row.closest.plan}"
    line = f"{sum(row.best.memory.values()) / GB:.1f} GB · {row.best.tokens_per_second:,.0f} tokens/s"
    if row.days is not None:
        line += f" · {row.work.tokens / 1e12:g}T tokens in {row.days:,.0f} days"
    return str(row.best.plan), line


def scenario_plans(rows: list[ScenarioRow] | None = None):
    """Per scenario, how many layouts lie within the planner's error band of the fastest, and the
    fastest plan's memory per GPU by kind against the capacity and its prediction."""
    rows = scenario_rows() if rows is None else rows
    capacity = {row.work.cluster.memory for row in rows}
    if len(capacity) != 1:
        raise ValueError(f"the scenarios have GPUs of different sizes ({sorted(capacity)}): one line "
                         "cannot show every capacity")
    cap = capacity.pop() / GB
    fig, (ax, side) = plt.subplots(1, 2, figsize=(14, 4.3), gridspec_kw={"width_ratios": [1, 1.6]},
                                   layout="constrained", sharey=True)
    plt.close(fig)
    for y, row in enumerate(rows):
        left = 0.0
        for kind in KINDS:
            value = row.shown.memory[kind] / GB
            ax.barh(y, value, left=left, height=0.62, color=KIND_COLORS[kind],
                    hatch=None if row.best else "//", alpha=1.0 if row.best else 0.45,
                    edgecolor="white", lw=0.8, label=kind if y == 0 else None)
            left += value
        if row.best is None:
            ax.text(left + 2, y, f"{left:.0f} GB\nat least", va="center", fontsize=11, color="#c0392b",
                    fontweight="bold")
        if row.band is not None:  # the band's size, the figure's point: the fastest is one plan of it
            side.text(COUNT_X, y, f"{len(row.band.choices)}", va="center", ha="right", fontsize=17,
                      fontweight="bold", color="#1f4e79")
        first, second = _row_text(row)
        side.text(TEXT_X, y - 0.19, first, va="center", fontsize=12,
                  color="black" if row.best else "#c0392b", fontweight=None if row.best else "bold")
        side.text(TEXT_X, y + 0.22, second, va="center", fontsize=11.5 if len(second) <= 64 else 10,
                  color="#333333")
    ax.axvline(cap, color="#c0392b", ls="--", lw=1.6)
    ax.text(cap + 2, -0.6, f"{cap:.0f} GB per GPU", color="#c0392b", ha="left", va="center", fontsize=11)
    usable = {row.work.cluster.usable_memory for row in rows}
    if len(usable) == 1 and (u := usable.pop() / GB) < cap:
        ax.axvline(u, color="#7f7f7f", ls=":", lw=1.4)
        ax.text(u - 2, -0.6, f"{u:.0f} GB usable", color="#555555", ha="right", va="center", fontsize=10)
    ax.set_yticks(range(len(rows)), [row.name for row in rows], fontsize=12)
    ax.set_ylim(len(rows) - 0.5, -0.9)
    ax.set_xlim(0, max(sum(r.shown.memory.values()) for r in rows) / GB * 1.2)
    ax.set_xlabel("GB per GPU (the busiest GPU: its pipeline stage holds the most)", fontsize=11)
    fig.legend(ncol=4, fontsize=11, loc="outside lower center", frameon=False)
    for spine in ("top", "right"):
        ax.spines[spine].set_visible(False)
    side.axis("off")
    side.set_xlim(0, 1)
    error = "/".join(sorted({f"±{row.band.error:.0%}" for row in rows if row.band is not None}))
    side.text(COUNT_X, -0.7, f"layouts\nwithin {error}", ha="right", va="center", fontsize=9.5,
              color="#1f4e79", fontweight="bold", linespacing=1.0)
    side.text(TEXT_X, -0.6, "the fastest of them (one plan of the band, not the answer)", va="center",
              fontsize=10.5, color="#555555")
    eff = "/".join(sorted({f"{row.work.cluster.efficiency:.0%}" for row in rows}))
    room = "/".join(sorted({f"{row.work.cluster.headroom:.0%}" for row in rows}))
    best = "/".join(sorted({f"{row.work.cluster.best_mfu:.0%}" for row in rows}))
    fig.suptitle(f"a band, not a winner: the layouts predicted within the planner's {error} error of the fastest "
                 "(parlab.planner_band.band), and the fastest's memory\n(predicted by planner v3: GEMMs at "
                 f"{eff} of peak × a shape factor, MFU under the best published ({best}), traffic overlapped "
                 f"where its framework overlaps it, ≤ {room} of HBM)", fontsize=11.5)
    return fig


def overflow_inches(fig) -> float:
    """How far (inches) what ``fig`` draws reaches past its edges once laid out; 0 when it fits."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    drawn = fig.get_tightbbox(canvas.get_renderer())  # inches, drawn artists only
    width, height = fig.get_size_inches()
    return max(0.0, -drawn.x0, -drawn.y0, drawn.x1 - width, drawn.y1 - height)


def report_lines(text: str) -> list[str]:
    """The calculator's HTML summary as plain lines."""
    return [html.unescape(re.sub(r"<[^>]+>", "", part)) for part in re.split(r"<br\s*/?>", text)]


def calculator_report(name: str = CALCULATOR_SCENARIO):
    """``parlab.calculator.report`` for the plan ``calculator(name)`` starts on, with its text."""
    work = planner.SCENARIOS[name]
    best = planner.search(work)
    if best is None:
        raise ValueError(f"no plan fits {name!r}, so the calculator starts on none; pick another scenario")
    fig, text = report(best.plan, work)
    plt.close(fig)
    lines = report_lines(text)
    width, height = fig.get_size_inches()
    extra = 0.3 * len(lines) + 0.2
    fig.set_size_inches(width, height + extra)
    scale = height / (height + extra)  # keep the bars and the legend where report() put them, in inches
    fig.subplots_adjust(top=1 - (1 - 0.82) * scale, bottom=extra / (height + extra) + 0.42 * scale)
    for i, line in enumerate(lines):
        fig.text(0.03, (extra - 0.15 - 0.3 * i) / (height + extra), line, fontsize=10, va="top",
                 color="#c0392b" if line.startswith("✗") else "black",
                 fontweight="bold" if i == 0 else None)
    return fig


FIGURES = {"scenario_plans": scenario_plans, "calculator_report": calculator_report}
