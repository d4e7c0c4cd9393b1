"""Render the lecture's figures to slides/figures/*.png with parlab.viz.

    .venv/bin/python slides/make_figures.py

The collective and mesh pictures are exact diagrams. The pipeline chart is an
*ideal* GPipe timetable (forward = 1 time unit, backward = 2), not a
measurement; the labs draw measured timelines from parlab.trace instead.
"""
import os

import matplotlib

matplotlib.use("Agg")

from parlab import cost, viz  # noqa: E402

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "figures")


def ideal_gpipe(p: int, m: int, fwd: float = 1.0, bwd: float = 2.0) -> list[dict]:
    """Start/end times of GPipe's all-forward-then-all-backward schedule."""
    spans = []
    for stage in range(p):
        for mb in range(m):
            start = (stage + mb) * fwd
            spans.append({"name": f"F{mb}", "rank": stage, "start": start, "end": start + fwd})
    backward_start = (p - 1 + m) * fwd
    for stage in range(p):
        for k, mb in enumerate(reversed(range(m))):
            start = backward_start + (p - 1 - stage + k) * bwd
            spans.append({"name": f"B{mb}", "rank": stage, "start": start, "end": start + bwd})
    return spans


def main() -> None:
    os.makedirs(OUT, exist_ok=True)
    for op in ("broadcast", "reduce", "all_reduce", "all_gather", "reduce_scatter", "barrier"):
        viz.collective_diagram(op, 4).savefig(os.path.join(OUT, f"collective_{op}.png"), dpi=150)
    for axis in ("tp", "dp", "pp"):
        viz.mesh_picture(2, 2, 2, highlight=axis).savefig(os.path.join(OUT, f"mesh_{axis}.png"), dpi=150)
    p, m = 4, 8
    viz.gantt(ideal_gpipe(p, m), title=f"Ideal GPipe timetable, p={p}, m={m} (forward 1 unit, backward 2)",
              show_bubble=True, predicted_bubble=cost.bubble_fraction(p, m, "gpipe"),
              unit="steps").savefig(os.path.join(OUT, "gpipe_ideal.png"), dpi=150)
    print(f"figures written to {OUT}")


if __name__ == "__main__":
    main()
