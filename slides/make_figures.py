"""Render the lecture's figures to slides/figures/*.png with parlab.viz.

    .venv/bin/python slides/make_figures.py

The collective and mesh pictures are exact diagrams (meshes keep TP innermost,
as ``init_device_mesh(..., (pp, dp, tp))`` does). The memory and time figures
are ``parlab.cost`` arithmetic (time assumes the same MFU at every GPU count). The pipeline chart is an
*ideal* GPipe timetable (forward = 1 time unit, backward = 2, from
``parlab.parallel.pp_schedule``, as lab 04's are), not a
measurement; the labs draw measured timelines from parlab.trace instead.
"""
import os

import matplotlib

matplotlib.use("Agg")

from parlab import cost, viz  # noqa: E402
from parlab.parallel.pp_schedule import ideal_schedule  # noqa: E402

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "figures")


def main() -> None:
    os.makedirs(OUT, exist_ok=True)
    for op in ("broadcast", "reduce", "all_reduce", "all_gather", "reduce_scatter", "barrier"):
        viz.collective_diagram(op, 4).savefig(os.path.join(OUT, f"collective_{op}.png"), dpi=150)
    for axis in ("tp", "dp", "pp"):  # TP innermost: rank = p·(dp·tp) + d·tp + t (parlab.parallel.mesh)
        viz.mesh_picture(pp=2, dp=2, tp=2, highlight=axis).savefig(os.path.join(OUT, f"mesh_{axis}.png"),
                                                                   dpi=150)
    # two DGX nodes of 8 GPUs: with TP innermost each TP group of 8 is one NVLink node
    viz.mesh_picture(pp=1, dp=2, tp=8, highlight="tp", gpus_per_node=8).savefig(
        os.path.join(OUT, "mesh_2_nodes_tp8.png"), dpi=150)
    viz.mesh_picture(pp=2, dp=2, tp=4, highlight="tp", gpus_per_node=8).savefig(
        os.path.join(OUT, "mesh_2_nodes_pp2_tp4.png"), dpi=150)
    viz.training_memory_bars({"1B": 1e9, "7B": 7e9, "13B": 13e9, "70B": 70e9}).savefig(
        os.path.join(OUT, "training_memory.png"), dpi=150)
    viz.time_to_train_curves({"7B, 2T tokens": (7e9, 2e12), "70B, 15T tokens": (70e9, 15e12)}).savefig(
        os.path.join(OUT, "time_to_train.png"), dpi=150)
    p, m = 4, 8
    viz.gantt(ideal_schedule(p, m, "gpipe"), title=f"Ideal GPipe timetable, p={p}, m={m} (forward 1 unit, backward 2)",
              show_bubble=True, predicted_bubble=cost.bubble_fraction(p, m, "gpipe"),
              unit="steps").savefig(os.path.join(OUT, "gpipe_ideal.png"), dpi=150)
    print(f"figures written to {OUT}")


if __name__ == "__main__":
    main()
