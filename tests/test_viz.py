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
    assert viz.mesh_picture(1, 2, 2, ax=b) is fig
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
    fwd = [b for b in ax.patches if b.get_facecolor()[:3] == matplotlib.colors.to_rgb(viz._SPAN_COLORS["forward"])]
    assert len(fwd) == 3
    assert "all_reduce\n4 MB" in texts_of(fig)
    assert layout_problems(fig) == []
    fig.savefig(tmp_path / "gantt.png")
    assert (tmp_path / "gantt.png").stat().st_size > 5000


def test_gantt_categories():
    cat = viz._category
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

@pytest.mark.parametrize("pp,tp,dp,highlight", [(2, 2, 2, "tp"), (2, 2, 4, "dp"), (4, 2, 2, "pp"),
                                                 (1, 1, 1, None), (1, 8, 8, "dp"), (3, 1, 2, "pp")])
def test_mesh_picture_layout(pp, tp, dp, highlight):
    fig = viz.mesh_picture(pp, tp, dp, highlight=highlight)
    assert layout_problems(fig) == []
    labels = texts_of(fig)
    for rank in range(pp * tp * dp):  # every rank once, next to its (p, t, d)
        assert labels.count(str(rank)) == 1
        i = labels.index(str(rank))
        p, t, d = rank // (tp * dp), rank // dp % tp, rank % dp
        assert labels[i + 1] == f"({p},{t},{d})"


def test_mesh_picture_groups():
    import torch

    mesh = torch.arange(8).view(2, 2, 2)
    for axis, dim in (("tp", 1), ("dp", 2), ("pp", 0)):
        fig = viz.mesh_picture(2, 2, 2, highlight=axis)
        legend = [t.get_text() for t in fig.legends[0].get_texts()]
        groups = mesh.movedim(dim, -1).reshape(-1, 2).tolist()  # ranks that differ only along axis
        assert all(s.startswith(f"{axis.upper()} group ") for s in legend)
        assert sorted(s.split(": ranks ")[1] for s in legend) == sorted(f"{a}, {b}" for a, b in groups)


def test_mesh_picture_bad_input():
    with pytest.raises(ValueError, match="tp must be a positive int"):
        viz.mesh_picture(2, 0, 2)
    with pytest.raises(ValueError, match="highlight"):
        viz.mesh_picture(2, 2, 2, highlight="ep")
    with pytest.raises(ValueError, match="too many"):
        viz.mesh_picture(8, 8, 8)


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
