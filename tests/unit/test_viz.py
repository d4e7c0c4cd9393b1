"""parlab.viz: every figure renders, draws what it claims, keeps its text inside
the figure without overlaps, and rejects bad input with a helpful ValueError."""
from __future__ import annotations

import io
from dataclasses import dataclass

import matplotlib

matplotlib.use("Agg")

import pytest  # noqa: E402
from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from parlab import viz  # noqa: E402

pytestmark = [pytest.mark.unit, pytest.mark.timeout(120)]


def layout_problems(fig: Figure) -> list[str]:
    """Text outside the figure, or two pieces of text on top of each other."""
    FigureCanvasAgg(fig)
    fig.canvas.draw()
    r = fig.canvas.get_renderer()
    width, height = fig.bbox.width, fig.bbox.height
    texts = [t for ax in fig.axes for t in (*ax.texts, ax.title)]
    legends = [*fig.legends, *(ax.get_legend() for ax in fig.axes)]
    texts += [t for leg in legends if leg for t in leg.get_texts()]
    if fig._suptitle is not None:
        texts.append(fig._suptitle)
    boxes = [(t.get_text(), t.get_window_extent(r)) for t in texts
             if t.get_visible() and t.get_text().strip()]
    boxes += [(f"axes {i}", ax.get_tightbbox(r)) for i, ax in enumerate(fig.axes)]
    out = [f"clipped: {s!r}" for s, b in boxes
           if b.x0 < -1 or b.y0 < -1 or b.x1 > width + 1 or b.y1 > height + 1]
    text_boxes = [(s, b) for s, b in boxes if not s.startswith("axes ")]
    for i, (s1, a) in enumerate(text_boxes):
        for s2, b in text_boxes[i + 1:]:
            if a.x0 < b.x1 - 1 and b.x0 < a.x1 - 1 and a.y0 < b.y1 - 1 and b.y0 < a.y1 - 1:
                out.append(f"overlap: {s1!r} / {s2!r}")
    return out


def texts_of(fig: Figure) -> list[str]:
    return [t.get_text() for ax in fig.axes for t in ax.texts]


def test_layout_checker_catches_clipping_and_overlap():
    fig = Figure(figsize=(3, 2))
    ax = fig.add_subplot()
    ax.text(0.5, 0.5, "hello")
    ax.text(0.5, 0.5, "hello again")  # same place: overlap
    ax.text(5.0, 0.5, "far away")  # outside the figure
    problems = layout_problems(fig)
    assert any("overlap" in p for p in problems) and any("clipped" in p for p in problems)


# ---------------------------------------------------------------- collectives

@pytest.mark.parametrize("op", viz.COLLECTIVE_OPS)
@pytest.mark.parametrize("n", [2, 4, 8])
def test_collective_diagram_renders_cleanly(op, n):
    fig = viz.collective_diagram(op, n)
    assert isinstance(fig, Figure)
    assert layout_problems(fig) == []


def test_collective_diagram_content():
    labels = texts_of(viz.collective_diagram("all_reduce", 4))
    assert labels.count("a0") == 1 and labels.count("Σ0") == 4  # before: a0 once; after: Σ0 everywhere
    labels = texts_of(viz.collective_diagram("reduce_scatter", 3))
    assert sorted(t for t in labels if t.startswith("Σ")) == ["Σ0", "Σ1", "Σ2"]
    labels = texts_of(viz.collective_diagram("all_gather", 3))
    assert labels.count("b1") == 1 + 3  # one rank holds it before, every rank after
    labels = texts_of(viz.collective_diagram("broadcast", 4))
    assert labels.count("a2") == 1 + 4 and "b0" not in labels
    assert labels.count("d3") == 0


def test_collective_diagram_bad_input():
    with pytest.raises(ValueError, match="unknown op 'allreduce_typo'.*all_reduce"):
        viz.collective_diagram("allreduce_typo")
    with pytest.raises(ValueError, match="n must be"):
        viz.collective_diagram("all_reduce", 1)
    with pytest.raises(ValueError, match="n must be"):
        viz.collective_diagram("all_reduce", 9)


def test_draw_into_own_axes():
    fig = Figure(figsize=(12, 4), layout="constrained")
    a, b = fig.subplots(1, 2)
    assert viz.collective_diagram("all_gather", 2, ax=a) is fig
    assert viz.mesh_picture(dp=2, tp=2, gpus_per_node=2, ax=b) is fig
    fig.savefig(io.BytesIO(), format="png")


# ---------------------------------------------------------------- gantt

@dataclass
class Span:  # the fields of parlab.trace.Span that gantt needs
    name: str
    rank: int
    start: float
    end: float
    bytes: int = 0


def gpipe_spans(p: int, m: int) -> list[dict]:
    """An ideal GPipe step in unit time steps: forward and backward take 1 each."""
    spans = []
    for s in range(p):
        for i in range(m):
            spans.append({"name": f"F{i}", "rank": s, "start": s + i, "end": s + i + 1})
            b = (m + p - 1) + (p - 1 - s) + i
            spans.append({"name": f"B{i}", "rank": s, "start": b, "end": b + 1})
    return spans


def test_gantt_bubble_matches_gpipe_formula():
    p, m = 4, 4
    fig = viz.gantt(gpipe_spans(p, m), show_bubble=True, unit="steps",
                    predicted_bubble=(p - 1) / (m + p - 1))
    title = fig.axes[0].get_title()
    share = f"{(p - 1) / (m + p - 1):.1%}"  # 42.9%
    assert f"in these spans {share}" in title and f"predicted {share}" in title
    assert layout_problems(fig) == []
    assert "F0" in texts_of(fig) and "B3" in texts_of(fig)


def test_gantt_accepts_objects_and_colours_by_kind(tmp_path):
    t0 = 1.7e9  # trace timestamps are epoch seconds
    spans = [Span("forward", r, t0 + 0.001 * r, t0 + 0.004 + 0.001 * r) for r in range(3)]
    spans += [Span("backward", r, t0 + 0.005, t0 + 0.011) for r in range(3)]
    spans += [Span("all_reduce", r, t0 + 0.011, t0 + 0.02, bytes=4_000_000) for r in range(3)]
    fig = viz.gantt(spans, title="DDP step")
    ax = fig.axes[0]
    assert ax.get_xlabel() == "time (ms)"
    assert ax.get_xlim()[1] == pytest.approx(20.0)
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert legend == ["forward", "backward", "all_reduce", "idle"]
    fwd = [b for b in ax.patches if b.get_facecolor()[:3] == matplotlib.colors.to_rgb(viz.timeline._SPAN_COLORS["forward"])]
    assert len(fwd) == 3
    assert "all_reduce\n4 MB" in texts_of(fig)
    assert layout_problems(fig) == []
    fig.savefig(tmp_path / "gantt.png")
    assert (tmp_path / "gantt.png").stat().st_size > 5000


def test_gantt_categories():
    cat = viz.timeline._category
    assert [cat("F3"), cat("fwd[mb=1]"), cat("B0"), cat("bwd"), cat("W2")] == \
        ["forward", "forward", "backward", "backward", "weight_grad"]
    assert cat("all_reduce bucket 2") == "all_reduce" and cat("allgather") == "all_gather"
    assert cat("my_custom_thing") == "my_custom_thing"


def test_gantt_bad_input():
    with pytest.raises(ValueError, match="no spans"):
        viz.gantt([])
    with pytest.raises(ValueError, match="needs name, rank, start and end"):
        viz.gantt([{"name": "F", "rank": 0, "start": 0.0}])
    with pytest.raises(ValueError, match="end >= start"):
        viz.gantt([{"name": "F", "rank": 0, "start": 2.0, "end": 1.0}])
    with pytest.raises(ValueError, match="unit"):
        viz.gantt(gpipe_spans(2, 2), unit="fortnights")


# ---------------------------------------------------------------- memory

def test_memory_bars_units_and_totals():
    gb = 1e9
    measured = {r: {"params": 2 * gb, "grads": 2 * gb, "optimizer": 3 * gb, "activations": gb * (1 + r)}
                for r in range(4)}
    predicted = {"params": 2 * gb, "grads": 2 * gb, "optimizer": 3 * gb, "activations": gb}
    fig = viz.memory_bars(measured, predicted)
    ax = fig.axes[0]
    assert ax.get_ylabel() == "memory (GB)"
    totals = texts_of(fig)
    assert totals[:2] == ["8", "8"] and totals[-2:] == ["11", "8"]  # rank 3: 2+2+3+4
    assert len(ax.patches) == 4 * 2 * 4  # ranks x (measured, predicted) x categories
    assert [t.get_text() for t in ax.get_xticklabels()] == [f"rank {r}" for r in range(4)]
    assert layout_problems(fig) == []
    small = viz.memory_bars({"plain DP": {"params": 3000, "grads": 3000}, "ZeRO-1": {"params": 3000}})
    assert small.axes[0].get_ylabel() == "memory (KB)"
    assert layout_problems(small) == []


def test_memory_bars_bad_input():
    with pytest.raises(ValueError, match="non-empty"):
        viz.memory_bars({})
    with pytest.raises(ValueError, match="bytes must be >= 0"):
        viz.memory_bars({0: {"params": -1}})
    with pytest.raises(ValueError, match="differ from measured labels"):
        viz.memory_bars({0: {"params": 1}, 1: {"params": 1}}, {0: {"params": 1}})


# ---------------------------------------------------------------- bandwidth

def test_bandwidth_curves_use_nccl_tests_definitions():
    sizes = [2**k for k in range(10, 27, 4)]
    seconds = [1e-4 + s / 1e9 for s in sizes]
    for op, n, factor in [("all_reduce", 4, 1.5), ("all_gather", 8, 7 / 8),
                          ("reduce_scatter", 2, 0.5), ("broadcast", 4, 1.0)]:
        fig = viz.bandwidth_curves(sizes, {"gloo": seconds}, op=op, n=n)
        line = fig.axes[0].get_lines()[0]
        expected = [s / t * factor / 1e9 for s, t in zip(sizes, seconds)]
        assert list(line.get_ydata()) == pytest.approx(expected)
        assert layout_problems(fig) == []
    fig = viz.bandwidth_curves(sizes, {"a": seconds, "b": seconds}, metric="algbw", n=4,
                               reference_lines={"NVLink ring": 370.0}, logy=True)
    ax = fig.axes[0]
    assert list(ax.get_lines()[0].get_ydata()) == pytest.approx([s / t / 1e9 for s, t in zip(sizes, seconds)])
    assert ax.get_ylabel() == "algbw (GB/s)" and ax.get_yscale() == "log"
    assert "1 KiB" in [t.get_text() for t in ax.get_xticklabels()]


def test_bandwidth_curves_bad_input():
    with pytest.raises(ValueError, match="3 times for 2 sizes"):
        viz.bandwidth_curves([1, 2], {"x": [1, 2, 3]})
    with pytest.raises(ValueError, match="positive sizes"):
        viz.bandwidth_curves([0, 2], {"x": [1, 2]})
    with pytest.raises(ValueError, match="non-positive time"):
        viz.bandwidth_curves([1, 2], {"x": [1, 0]})
    with pytest.raises(ValueError, match="unknown collective"):
        viz.bandwidth_curves([1, 2], {"x": [1, 2]}, op="all_reduce_typo")
    with pytest.raises(ValueError, match="metric"):
        viz.bandwidth_curves([1, 2], {"x": [1, 2]}, metric="speed")
    with pytest.raises(ValueError, match="algbw"):
        viz.bandwidth_curves([1, 2], {"x": [1, 2]}, n=1)


# ---------------------------------------------------------------- mesh

@pytest.mark.parametrize("pp,dp,tp,highlight,gpus_per_node", [
    (2, 2, 2, "tp", None), (2, 4, 2, "dp", 4), (4, 2, 2, "pp", None), (1, 1, 1, None, None),
    (1, 8, 8, "dp", 8), (3, 2, 1, "pp", None), (1, 2, 8, "tp", 8), (1, 4, 3, "tp", 8)])
def test_mesh_picture_layout(pp, dp, tp, highlight, gpus_per_node):
    fig = viz.mesh_picture(pp=pp, dp=dp, tp=tp, highlight=highlight, gpus_per_node=gpus_per_node)
    assert layout_problems(fig) == []
    labels = texts_of(fig)
    for rank in range(pp * dp * tp):  # every rank once, next to its (p, d, t): TP innermost
        assert labels.count(str(rank)) == 1
        i = labels.index(str(rank))
        p, d, t = rank // (dp * tp), rank // tp % dp, rank % tp
        assert labels[i + 1] == f"({p},{d},{t})"


def test_mesh_picture_groups():
    import torch

    mesh = torch.arange(8).view(2, 2, 2)  # (pp, dp, tp), as init_device_mesh lays it out
    for axis, dim in (("pp", 0), ("dp", 1), ("tp", 2)):
        fig = viz.mesh_picture(pp=2, dp=2, tp=2, highlight=axis)
        legend = [t.get_text() for t in fig.legends[0].get_texts()]
        groups = mesh.movedim(dim, -1).reshape(-1, 2).tolist()  # ranks that differ only along axis
        assert all(s.startswith(f"{axis.upper()} group ") for s in legend)
        assert sorted(s.split(": ranks ")[1] for s in legend) == sorted(f"{a}, {b}" for a, b in groups)


def _node_lines(fig):
    return [ln for ln in fig.axes[0].get_lines() if ln.get_color() == viz.mesh._NODE_EDGE]


def test_mesh_picture_node_boundaries():
    # 16 GPUs on 2 nodes of 8, tp = 8: each TP group is one node, drawn as one outlined row
    fig = viz.mesh_picture(pp=1, dp=2, tp=8, gpus_per_node=8)
    assert "2 nodes of 8 GPUs: every TP group stays inside one node" in fig._suptitle.get_text()
    assert len(_node_lines(fig)) == 2 * (8 + 8 + 1 + 1)  # two 8x1 rows, each outlined
    ys = sorted({y for ln in _node_lines(fig) for y in ln.get_ydata()})
    assert ys == [0, 1, 2]  # the boundary between the nodes runs between row d=0 and row d=1
    # dp = 4, tp = 3 on nodes of 8: rank 8 shares a TP group with 6 and 7 but sits on node 1
    fig = viz.mesh_picture(pp=1, dp=4, tp=3, gpus_per_node=8)
    assert "TP groups that cross a node boundary: 1 of 4" in fig._suptitle.get_text()
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert legend[-1] == "node boundary: node k holds ranks 8k to 8k + 7"
    assert _node_lines(viz.mesh_picture(pp=2, dp=2, tp=2)) == []  # no nodes asked, none drawn


def test_mesh_picture_bad_input():
    with pytest.raises(ValueError, match="tp must be a positive int"):
        viz.mesh_picture(pp=2, dp=2, tp=0)
    with pytest.raises(ValueError, match="highlight"):
        viz.mesh_picture(pp=2, dp=2, tp=2, highlight="ep")
    with pytest.raises(ValueError, match="too many"):
        viz.mesh_picture(pp=8, dp=8, tp=8)
    with pytest.raises(ValueError, match="gpus_per_node must be a positive int"):
        viz.mesh_picture(pp=2, gpus_per_node=0)
    with pytest.raises(TypeError):  # sizes are keyword-only: no silent axis-order mix-up
        viz.mesh_picture(2, 2, 2)


# ---------------------------------------------------------------- lab 00: memory and time

def test_training_memory_bars_use_cost_model():
    from parlab import cost

    models = {"1B": 1e9, "7B": 7e9, "70B": 70e9}
    fig = viz.training_memory_bars(models)
    ax = fig.axes[0]
    assert ax.get_ylabel() == "training state (GB)"
    heights = [p.get_height() for p in ax.patches]
    assert len(heights) == 3 * 3  # models x (weights, gradients, optimizer state)
    for i, n in enumerate(models.values()):
        b = cost.training_bytes(n)
        assert heights[3 * i:3 * i + 3] == pytest.approx([b.weights / 1e9, b.grads / 1e9, b.optimizer / 1e9])
    assert list(ax.get_lines()[0].get_ydata()) == [80.0, 80.0]  # the H100 line
    assert texts_of(fig) == ["16 GB\n≥ 1 GPU", "112 GB\n≥ 2 GPUs", "1,120 GB\n≥ 14 GPUs"]
    assert layout_problems(fig) == []
    fig = viz.training_memory_bars({"7B": 7e9}, gpu_memory=40e9, optim_bytes=4)  # another GPU, SGD+momentum
    assert texts_of(fig) == ["56 GB\n≥ 2 GPUs"]
    assert "optimizer state (4 B/param)" in [t.get_text() for t in fig.legends[0].get_texts()]


def test_training_memory_bars_bad_input():
    with pytest.raises(ValueError, match="non-empty dict of label -> number of parameters"):
        viz.training_memory_bars({})
    with pytest.raises(ValueError, match=r"models\['7B'\] must be a positive number"):
        viz.training_memory_bars({"7B": -7e9})
    with pytest.raises(ValueError, match="gpu_memory must be a positive number"):
        viz.training_memory_bars({"7B": 7e9}, gpu_memory=0)


def test_time_to_train_curves_use_cost_model():
    from parlab import cost

    models = {"7B, 2T tokens": (7e9, 2e12), "70B, 15T tokens": (70e9, 15e12)}
    gpus = [1, 8, 64, 512, 4096]
    fig = viz.time_to_train_curves(models, gpus, mfu=0.5)
    ax = fig.axes[0]
    lines = ax.get_lines()
    for line, (n, tokens) in zip(lines, models.values()):
        assert list(line.get_xdata()) == gpus
        expected = [cost.time_to_train(n, tokens, g, cost.H100_BF16_PEAK, 0.5) / 86_400 for g in gpus]
        assert list(line.get_ydata()) == pytest.approx(expected)
    assert [ln.get_ydata()[0] for ln in lines[2:]] == [1, 30, 365]  # a day, a month, a year
    assert ax.get_xscale() == ax.get_yscale() == "log"
    assert "4,096" in [t.get_text() for t in ax.get_xticklabels()]
    assert "MFU 50%" in ax.get_title()
    assert layout_problems(fig) == []


def test_time_to_train_curves_bad_input():
    with pytest.raises(ValueError, match="non-empty dict of label"):
        viz.time_to_train_curves({})
    with pytest.raises(ValueError, match="must be a pair"):
        viz.time_to_train_curves({"x": 7e9})
    with pytest.raises(ValueError, match="tokens of models\\['x'\\] must be a positive number"):
        viz.time_to_train_curves({"x": (7e9, 0)})
    with pytest.raises(ValueError, match="gpus must be a non-empty list"):
        viz.time_to_train_curves({"x": (7e9, 1e12)}, gpus=[0, 8])
    with pytest.raises(ValueError, match="mfu"):
        viz.time_to_train_curves({"x": (7e9, 1e12)}, mfu=1.5)


def _bar_rows(fig):
    """Centre y of each non-background bar, by colour-independent geometry."""
    ax = fig.axes[0]
    return sorted({round(p.get_y() + p.get_height() / 2, 2) for p in ax.patches if p.get_hatch() is None})


def test_gantt_puts_overlapping_communication_in_its_own_lane():
    overlapping = [dict(name="backward", rank=0, start=0, end=10),
                   dict(name="all_reduce", rank=0, start=4, end=12, bytes=100)]
    assert _bar_rows(viz.gantt(overlapping)) == [-0.2, 0.2]  # compute above, comm below
    sequential = [dict(name="backward", rank=0, start=0, end=10),
                  dict(name="all_reduce", rank=0, start=10, end=12, bytes=100)]
    assert _bar_rows(viz.gantt(sequential)) == [0.0]
    assert _bar_rows(viz.gantt(sequential, comm_lane=True)) == [-0.2, 0.2]
