"""The lecture deck: it builds, works offline, and agrees with the labs and parlab.cost.

Tier ``unit``: the build runs in this process (matplotlib for the figures,
nbconvert's SlidesExporter as a library) and starts no process; the PDF,
which needs Chromium, is left to ``make slides``.  The browser tier
(tests/browser/test_slides_browser.py) steps through the built deck in Chromium.
"""
from __future__ import annotations

import dataclasses
import importlib.util
import json
import re
import sys
from pathlib import Path

import pytest

from parlab import cost, planner, planner_band, planner_frameworks, planner_published, viz

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]
SLIDES = REPO / "slides"


def _load(name: str, path: Path):
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # build.py's dataclasses look themselves up there
        spec.loader.exec_module(module)
    return sys.modules[name]


def _build_module():
    return _load("parlab_slides_build", SLIDES / "build.py")


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    build = _build_module()
    return build.build(tmp_path_factory.mktemp("deck"), pdf=False)


def _deck_cells():
    return json.loads((SLIDES / "lecture.ipynb").read_text(encoding="utf-8"))["cells"]


def _notes(title: str) -> str:
    """The speaker notes of the slide whose heading is ``## title``."""
    cells = _deck_cells()
    starts = [i for i, c in enumerate(cells) if "".join(c["source"]).startswith(f"## {title}\n")]
    assert len(starts) == 1, f"{len(starts)} slides titled {title!r}: update this test with the slide"
    out = []
    for cell in cells[starts[0] + 1:]:
        kind = cell["metadata"].get("slideshow", {}).get("slide_type", "-")
        if kind in ("slide", "subslide"):
            break
        if kind == "notes":
            out.append("".join(cell["source"]))
    return "\n".join(out)


def _slides():
    """Each slide's markdown (notes excluded), in order."""
    out = []
    for cell in _deck_cells():
        kind = cell["metadata"].get("slideshow", {}).get("slide_type", "-")
        text = "".join(cell["source"])
        if kind in ("slide", "subslide"):
            out.append(text)
        elif kind not in ("notes", "skip") and out:
            out[-1] += "\n" + text
    return out


def test_deck_builds_with_every_image_present_and_non_empty(built):
    # the lecture plan: 30-45 slides for the four axes and their tools, plus lab 07's context- and
    # expert-parallelism section (a divider and 4 slides, issue 21), made partly room for by putting the
    # six collectives on one slide, and lab 08's section on what a real configuration sets (a divider and
    # 6 slides, issue 44)
    assert 30 <= built.slides <= 57, f"{built.slides} slides; the lecture plan is 30-57"
    assert built.slides == len(_slides())
    assert len(built.images) >= 15
    for src in built.images:
        path = built.html.parent / src
        assert path.is_file(), f"{src} is referenced by the deck but missing"
        assert path.stat().st_size > 1000, f"{src} is (nearly) empty"
    # every figure the notebook names was drawn by this build (not left over from an older one)
    named = {m for text in _slides() for m in re.findall(r'src="(figures/[^"]+)"', text)}
    assert named == set(built.images)


def test_built_html_loads_nothing_from_the_network(built):
    html = built.html.read_text(encoding="utf-8")
    for url in built.scripts + built.stylesheets + built.images:
        assert not re.match(r"^(https?:)?//", url), url
    assert any(s.endswith("dist/reveal.js") for s in built.scripts)
    assert not re.search(r"<script[^>]+src=\"https?:", html)
    assert "cdnjs" not in html and "unpkg" not in html


def test_offline_check_rejects_a_remote_script_and_a_missing_image(built, tmp_path):
    build = _build_module()
    page = tmp_path / "page.html"
    page.write_text('<section><img src="figures/none.png"></section>'
                    '<script src="https://cdn.example.org/reveal.js"></script>')
    with pytest.raises(build.BuildError) as err:
        build.check_offline(page)
    assert "loaded from the network" in str(err.value) and "missing or empty" in str(err.value)


def test_latex_in_the_source_is_refused_with_what_to_do():
    import nbformat

    build = _build_module()
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("memory is $16\\Psi$")])
    with pytest.raises(build.BuildError, match="Unicode"):
        build.check_source(nb)


def _existing_labs() -> dict[str, str]:
    """Lab number -> the text of its solution notebook, for the labs that exist."""
    labs = {}
    for nb in sorted((REPO / "solutions").glob("*/*.ipynb")):
        labs[nb.parent.name[:2]] = nb.read_text(encoding="utf-8")
    return labs


def test_lab_references_name_real_exercises_or_say_coming():
    labs = _existing_labs()
    assert {"00", "01", "02"} <= set(labs)
    for i, text in enumerate(_slides(), start=1):
        for line in text.splitlines():
            for lab in re.findall(r"Lab (\d\d)", line):
                if lab not in labs:
                    assert "coming" in line, f"slide {i} cites Lab {lab}, which does not exist yet, " \
                                             f"without saying '(coming)': {line!r}"
                else:
                    assert f"Lab {lab} (coming)" not in line, f"slide {i}: Lab {lab} exists now: {line!r}"
            for lab, what in re.findall(r"Lab (\d\d), (Exercises? [\w–, and]+)", line):
                assert lab in labs, f"slide {i}: {line!r}"
                for ex in re.findall(r"\d+[a-z]?", what):
                    assert f"Exercise {ex}" in labs[lab], \
                        f"slide {i} cites Lab {lab} Exercise {ex}, which its notebook does not have"


def test_every_content_slide_with_a_lab_topic_names_its_lab():
    """Slides after the opening that are not section dividers carry a lab line, except the
    few that are about no single lab (listed here on purpose)."""
    general = {"What each axis splits", "What each axis costs",
               "One DGX H100 node", "What to remember", "References", "Today",
               "Parallelism fundamentals for training", "Running the labs on the DGX"}
    for i, text in enumerate(_slides(), start=1):
        title = re.search(r"^#+ (.+)$", text, re.M).group(1).strip()
        divider = re.match(r"\d+ · ", title)
        if divider or title in general:
            continue
        assert re.search(r"Lab \d\d", text), f"slide {i} ({title!r}) names no lab"


def _best(name: str) -> planner.Prediction:
    found = planner.search(planner.SCENARIOS[name])
    assert found is not None, f"the planner finds no plan for {name!r} any more: update the scenario slide"
    return found


_70B_8, _70B_64, _15T = "70B on 8 H100s", "70B on 64 H100s", "70B on 15T tokens (2048 H100s)"


def _7b_long_activations(cp: int) -> float:
    m = planner.SCENARIOS["7B, 32k-token sequences (64 H100s)"].model
    assert (m.hidden, m.heads, m.layers, m.seq) == (4096, 32, 32, 32768)
    return m.layers * cost.activation_bytes_per_layer(m.seq / cp, 1, m.hidden, m.heads, scores=False,
                                                      **m.shape) / 1e9


@pytest.mark.parametrize("snippet, value", [
    ("**1,120 GB**", cost.training_bytes(70e9).total / 1e9),
    ("**140 GB**", cost.weights_bytes(70e9) / 1e9),
    ("**120 → 31.4 → 16.6 → 1.9 GB**", [cost.zero_memory_per_gpu(7.5e9, 64, s) / 1e9 for s in range(4)]),
    ("**17.5 GB**", cost.zero_memory_per_gpu(70e9, 64, 3) / 1e9),
    ("| 6.51 GB |", cost.activation_bytes_per_layer(4096, 1, 8192, 64) / 1e9),
    ("| 0.81 GB |", cost.activation_bytes_per_layer(4096, 1, 8192, 64, t=8, sp=True) / 1e9),
    # the same table with FlashAttention / SDPA (no stored scores)
    ("| 6.51 GB | 1.14 GB |", [cost.activation_bytes_per_layer(4096, 1, 8192, 64, scores=s) / 1e9
                               for s in (True, False)]),
    ("| 1.11 GB | 0.44 GB |", [cost.activation_bytes_per_layer(4096, 1, 8192, 64, t=8, scores=s) / 1e9
                               for s in (True, False)]),
    ("| 0.81 GB | 0.14 GB |", [cost.activation_bytes_per_layer(4096, 1, 8192, 64, t=8, sp=True, scores=s) / 1e9
                               for s in (True, False)]),
    ("| 0.07 GB | 0.07 GB |", [cost.activation_bytes_per_layer(4096, 1, 8192, 64, recompute="full", scores=s) / 1e9
                               for s in (True, False)]),
    ("| 0.47 GB |", cost.comm_bytes(cost.tp_comm_elems_per_layer(1, 4096, 8192, 8)) / 1e9),
    ("| 27.3 % |", 100 * cost.bubble_fraction(4, 8)),
    ("**180 days**", cost.time_to_train(70e9, 15e12, 1024) / cost.SECONDS_PER_DAY),
    # the CP/EP section (lab 07), against parlab.cost with the planner's 7B 32k-token model
    ("**138 GB** of activations per GPU", lambda: _7b_long_activations(1)),
    ("cp = 2: **69 GB**", lambda: [2, _7b_long_activations(2)]),
    ("7B, s = 32,768, c = 2, bf16: **0.81 GB** per layer",
     [7, 32768, 2, 16, cost.comm_bytes(cost.cp_comm_elems_per_layer(1, 32768, 4096, 2, reverse_backward=True)) / 1e9]),
    ("max ÷ mean → (2c − 1)/c, **1.75** at c = 4", [2, 1, (2 * 4 - 1) / 4, 4]),
    ("h = 4,096, top-2, T = 4,096 tokens, n = 8, bf16: **0.23 GB** per layer",
     [4096, 2, 4096, 8, 16, cost.comm_bytes(cost.ep_comm_elems_per_layer(4096, 4096, 2, 8)) / 1e9]),
    # the scenario slide, against parlab.planner (callables: evaluated when the test runs)
    ("**1,260 GB** of model states (18 B × 70B) > **640 GB** in the node",
     lambda: [cost.model_state_bytes(planner.SCENARIOS[_70B_8].model.params, 1, 0,
                                     planner.SCENARIOS[_70B_8].precision) / 1e9,
              sum(cost.PRECISIONS[planner.SCENARIOS[_70B_8].precision]),
              planner.SCENARIOS[_70B_8].model.params / 1e9,
              planner.SCENARIOS[_70B_8].cluster.gpus * planner.SCENARIOS[_70B_8].cluster.memory / 1e9]),
    ("**dp 4 × tp 4 (SP) × pp 4, ZeRO-1**",
     lambda: [_best(_70B_64).plan.dp, _best(_70B_64).plan.tp, _best(_70B_64).plan.pp, _best(_70B_64).plan.zero]),
    ("**16 layouts within ±15 %**",
     lambda: [len(planner_band.band(planner.SCENARIOS[_70B_64]).choices), 100 * planner_published.error_band()]),
    ("**15T tokens on 2,048 GPUs: ≈ 104 days.**",
     lambda: [planner.SCENARIOS[_15T].tokens / 1e12, planner.SCENARIOS[_15T].cluster.gpus,
              planner.time_to_train(_best(_15T).plan, planner.SCENARIOS[_15T]) / cost.SECONDS_PER_DAY]),
])
def test_numbers_on_the_slides_are_parlab_numbers(snippet, value):
    deck = "\n".join(_slides())
    assert snippet in deck, f"{snippet!r} is no longer on any slide: update this test with the slide"
    value = value() if callable(value) else value
    shown = [float(x.replace(",", "")) for x in re.findall(r"\d[\d,]*\.?\d*", snippet)]
    expected = value if isinstance(value, list) else [value]
    assert len(shown) == len(expected), (shown, expected)
    for s, e in zip(shown, expected):
        digits = len(str(s).split(".")[1].rstrip("0")) if "." in str(s) else 0
        assert abs(s - e) <= 0.51 * 10 ** -digits, f"slide says {s}, parlab gives {e:.4g}"


def test_the_scenario_slides_claims_hold_in_the_planner():
    """What the scenario slide and its notes say in words, checked against parlab.planner."""
    slide = next(t for t in _slides() if t.startswith("## What the planner says"))
    notes = _notes("What the planner says: six scenarios on H100s")
    work8, work64 = planner.SCENARIOS[_70B_8], planner.SCENARIOS[_70B_64]
    # "70B on 8 GPUs does not fit, whatever the layout": every GPU holds at least 18Ψ/N of states
    assert "does not fit, whatever the layout" in slide and planner.search(work8) is None
    floor = cost.model_state_bytes(work8.model.params, work8.cluster.gpus, 3, work8.precision)
    assert f"1,260 / 8 = {floor / 1e9:.0f} GB" in notes and floor > work8.cluster.memory
    figures = _load("parlab_slides_planner_figures", SLIDES / "planner_figures.py")
    closest = figures.closest_candidate(work8).plan
    assert "(tp = 8 with sequence parallelism and full recomputation)" in notes
    assert (closest.tp, closest.sp, closest.recompute) == (8, True, "full"), closest
    # "70B on 64 fits without recomputation", with TP inside the node and PP across nodes
    best = _best(_70B_64)
    assert "70B on 64**, no recomputation" in slide
    assert best.plan.recompute == "none" and best.plan.sp
    assert best.plan.tp <= work64.cluster.gpus_per_node and any(planner.boundary_crosses(best.plan, work64.cluster))
    # a band, not a winner: each framework's layout at its own best settings, priced as that framework runs it
    band = planner_band.band(work64)
    assert "a band, not a winner" in slide
    megatron, fsdp = band.find(dp=4, tp=4, pp=4, zero=1, v=1), band.find(dp=64, tp=1, pp=1, zero=3)
    assert megatron and fsdp and (fsdp.plan.micro_batch, fsdp.plan.recompute) == (4, "full"), fsdp.plan
    assert band.find(dp=8, tp=8, pp=1) is None  # torchtitan's TP 8 × FSDP: outside, its gathered inputs priced
    titan = planner_band.band(work64, error=0.999).find(dp=8, tp=8, pp=1)
    titan4 = planner.predict(planner.Plan(dp=8, tp=8, pp=1, zero=3, micro_batch=4, accum=32), work64)
    assert titan.notes["framework"] == "torchtitan" and not titan4.fits
    assert f"layouts within ±{planner_published.error_band():.0%}**: a band, not a winner (next slide)".replace(
        "%*", " %*") in slide
    band_slide = next(t for t in _slides() if t.startswith("## 70B on 64: a band, not a winner\n"))
    band_notes = _notes("70B on 64: a band, not a winner")
    assert f"tp = 4 × pp = 4 with ZeRO-1 without interleaving is at {megatron.share:.3f} of the fastest" in band_notes
    assert f"torchtitan's FSDP over all 64 GPUs with full recomputation at {fsdp.share:.3f}" in band_notes
    assert (f"at micro-batch 4 without recomputation needs {sum(titan4.memory.values()) / 1e9:.1f} GB, and its best "
            f"runnable form, full recomputation at micro-batch {titan.plan.micro_batch}, is at {titan.share:.3f} of "
            "the fastest: outside the band") in band_notes
    assert f"needs **{sum(titan4.memory.values()) / 1e9:.1f} GB** at micro-batch 4" in band_slide
    assert f"the fastest leaves {band.best.notes['margin']}, the same layout without interleaving " \
           f"{megatron.notes['margin']}" in band_notes
    assert planner_band.layout_key(band.best.plan) == (4, 1, 4, 4, 2, 1, "Megatron-LM") and band.best.plan.zero == 1
    assert all(planner_frameworks.runs_on(c.plan) for c in band.choices)
    # the figure's counts, as the notes list them: every scenario taught as a band
    error = f"±{planner_published.error_band():.0%}".replace("%", " %")
    short = {"1.3B on 8": "1.3B fits one GPU (8 H100s)", "7B on 8": "7B on 8 H100s", "70B on 64": _70B_64,
             "7B at 32k": "7B, 32k-token sequences (64 H100s)", "70B on 2,048": _15T}
    counts = ", ".join(f"{label}: {len(planner_band.band(planner.SCENARIOS[name]).choices)}"
                       for label, name in short.items())
    assert f"within the planner's {error} error on published runs of the fastest, each at its own best " \
           f"micro-batch and recomputation ({counts})" in notes
    # the practitioners' layouts: NeMo's recipe adds v = 5 (not searched), priced directly
    nemo = planner.predict(planner.Plan(dp=4, tp=4, pp=4, zero=1, v=5, micro_batch=1,
                                        accum=work64.global_batch // 4), work64)
    assert 5 not in {p.v for p in planner.candidates(work64)} and nemo.fits
    assert f"priced directly, v = 5 predicts {nemo.tokens_per_second / band.best.prediction.tokens_per_second:.3f} " \
           "of the fastest" in band_notes
    assert "nemo/collections/llm/recipes/llama3_70b.py" in band_notes and "llama3_70b.toml" in band_notes
    # the band slide's table: each row's share, memory left and framework, from the planner
    nemo_left = f"{(work64.cluster.usable_memory - sum(nemo.memory.values())) / 1e9:.1f} GB"
    rows = [("dp 4 × tp 4 (SP) × pp 4, ZeRO-1, v = 2", band.best, band.best.notes["margin"]),
            ("the same, v = 1", megatron, megatron.notes["margin"]),
            ("the same, v = 5: NeMo's Llama 3 70B recipe", nemo, nemo_left),
            (f"FSDP (ZeRO-3) over dp 64, micro-batch {fsdp.plan.micro_batch}, full recomputation", fsdp,
             fsdp.notes["margin"]),
            ("tp 8 × FSDP over dp 8: torchtitan's llama3_70b.toml", titan, titan.notes["margin"])]
    for label, choice, left in rows:
        pred = choice if isinstance(choice, planner.Prediction) else choice.prediction
        share = pred.tokens_per_second / band.best.prediction.tokens_per_second
        shown = "1" if pred is band.best.prediction else f"{share:.3f}"
        row = f"| {label} | **{shown}** | **{left}** | {planner_frameworks.runs_on(pred.plan)} |"
        assert row in band_slide, f"{row!r} is not on the band slide"
        assert (share >= 1 - band.error) == (choice is not titan)
    assert f"The first four are inside the **{error}** by which the planner misses published runs" in band_slide
    # under torchtitan's op-level checkpointing (opt-in to the search) its TP 8 × FSDP fits at micro-batch 4
    op = planner_band.band(planner.replace(work64, op_sac=True)).find(dp=8, tp=8, pp=1)
    op_share = op.prediction.tokens_per_second / band.best.prediction.tokens_per_second
    assert op.plan.recompute == "op" and op.plan.micro_batch == 4 and op_share >= 1 - band.error
    assert f"with torchtitan's op-level checkpointing it fits at micro-batch 4, at **{op_share:.3f}**, just inside" \
        in band_slide
    assert (f"the same layout fits at micro-batch 4 ({sum(op.prediction.memory.values()) / 1e9:.1f} GB) and predicts "
            f"{op_share:.3f} of the fastest, just inside the band") in band_notes
    assert "the nine heterogeneous published runs it covers" in notes
    # the band the known miss would set if counted at the H100 SXM's peak
    miss = next(r for r in planner_published.RUNS if r.miss)
    wide = abs(planner_published.ratios()[miss.name] - 1)
    assert wide > band.error and f"its {planner_published.ratios()[miss.name]:.2f} would set the band at " \
        f"±{wide:.0%}".replace("%", " %") in notes
    assert sum(not r.miss for r in planner_published.RUNS) == 9
    batch = work64.global_batch // 8
    calc_old = planner.predict(planner.Plan(dp=8, tp=8, pp=1, zero=3, micro_batch=best.plan.micro_batch,
                                            accum=batch, recompute=best.plan.recompute), work64)
    assert calc_old.fits and calc_old.tokens_per_second < best.tokens_per_second
    calculator = _notes("A calculator to keep")
    assert "set tp = 8, pp = 1 and ZeRO-3. The layout still fits, and at micro-batch 1 the throughput drops" \
        in calculator and best.plan.micro_batch == 1
    assert (f"drops to {calc_old.tokens_per_second:,.0f} tokens/s, "
            f"{calc_old.tokens_per_second / best.tokens_per_second:.3f} of the best plan's") in calculator
    assert f"{work64.global_batch // 8} of them per step" in calculator
    full4 = planner.predict(planner.replace(titan4.plan, recompute="full"), work64)
    assert f"Raise the micro-batch to 4 (recomputation none) and the layout no longer fits: " \
           f"{sum(titan4.memory.values()) / 1e9:.1f} GB" in calculator
    assert (f"With full recomputation it fits again and predicts {full4.tokens_per_second:,.0f} tokens/s, "
            f"{full4.tokens_per_second / best.tokens_per_second:.3f} of the best: outside the band") in calculator
    assert full4.fits and full4.tokens_per_second < best.tokens_per_second * (1 - band.error)
    assert "Most of the drop is the DP part" in _notes("A calculator to keep")
    assert calc_old.time["dp"] == max(v for k, v in calc_old.time.items() if k not in ("total", "compute"))
    # activations fill most of the 1.3B plan's GPU; 7B at 32k tokens fits without recomputation, with cp = 4
    assert "Activations, not model states, fill most of the 1.3B plan's GPU, and 7B at 32k tokens fits " \
           "without recomputation: the planner splits each sequence over cp = 4" in notes
    small = _best("1.3B fits one GPU (8 H100s)").memory
    assert small["activations"] > sum(small.values()) / 2
    work_long = planner.SCENARIOS["7B, 32k-token sequences (64 H100s)"]
    long = _best("7B, 32k-token sequences (64 H100s)")
    assert (long.plan.cp, long.plan.recompute) == (4, "none")
    two = [p for p in planner.candidates(work_long) if (p.cp, p.tp, p.pp, p.recompute) == (2, 1, 1, "none")]
    assert "cp = 2 without TP or PP no longer fits without recomputation" in notes
    assert two and all(planner.problems(p, work_long) for p in two)
    no_cp = max((planner.predict(p, work_long) for p in planner.candidates(work_long)
                 if p.cp == 1 and not planner.problems(p, work_long)), key=lambda g: g.tokens_per_second)
    assert (no_cp.plan.tp, no_cp.plan.sp) == (4, True), no_cp.plan
    gain = long.tokens_per_second / no_cp.tokens_per_second - 1
    assert f"predicted {gain:.0%} faster".replace("%", " %") in notes
    assert f"That gain lies inside the {error} band" in notes and gain < planner_published.error_band()
    # Meta's 6.4M H100-hours on 2,048 GPUs: "about 130 days", against the planner's
    assert "6.4M H100-hours" in notes and "about 130 days on 2,048 GPUs" in notes
    assert round(6.4e6 / 2048 / 24, -1) == 130
    days = planner.time_to_train(_best(_15T).plan, planner.SCENARIOS[_15T]) / cost.SECONDS_PER_DAY
    assert f"the planner predicts {days:.0f} days, about a fifth less" in notes
    assert 0.15 <= 1 - days / (6.4e6 / 2048 / 24) <= 0.25


def test_the_expert_parallel_notes_state_what_the_planner_prices():
    notes = _notes("Expert parallelism: two all-to-alls per MoE layer")
    assert "does not model EP" not in notes
    for name in ("experts", "top_k", "expert_ffn", "shared_experts"):
        assert name in notes and name in {f.name for f in dataclasses.fields(planner.ModelSpec)}
    assert {"ep", "ep_overlap"} <= {f.name for f in dataclasses.fields(planner.Plan)}
    run = next(r for r in planner_published.RUNS if r.name.startswith("DeepSeek-V3"))
    assert (run.plan.pp, run.plan.ep, run.plan.zero, run.work.cluster.gpus) == (16, 64, 1, 2048)
    ratio = planner_published.ratios()[run.name]
    assert f"predicted at {ratio:.2f} of its reported throughput, inside the band" in notes
    assert abs(ratio - 1) <= planner_published.error_band()


def _figures_module():
    return _load("parlab_slides_planner_figures", SLIDES / "planner_figures.py")


def _texts(fig) -> str:
    return "\n".join(t.get_text() for t in fig.findobj(lambda a: hasattr(a, "get_text")))


def _bar_widths(ax) -> dict[float, list[float]]:
    """Widths of the horizontal bars of ``ax`` by row, left to right."""
    from matplotlib.patches import Rectangle

    rows = {}
    for patch in sorted(ax.patches, key=lambda p: p.get_x()):
        if isinstance(patch, Rectangle):
            rows.setdefault(round(patch.get_y() + patch.get_height() / 2, 6), []).append(patch.get_width())
    return rows


def test_scenario_figure_is_the_planners_band_and_best_plan_for_every_scenario():
    figures = _figures_module()
    rows = figures.scenario_rows()
    assert [r.name for r in rows] == list(planner.SCENARIOS)
    for row in rows:
        assert row.best == planner.search(row.work), row.name
        assert row.band == planner_band.band(row.work), row.name
        assert (row.band is None) == (row.best is None), row.name
        if row.band is not None:  # the band's fastest is search's plan, whatever else it holds
            assert row.band.best.prediction.tokens_per_second == pytest.approx(row.best.tokens_per_second)
        if row.best is None:  # what the figure draws instead: a plan that fails on memory alone
            assert row.closest.problems and all("GB per GPU" in p for p in row.closest.problems)
            assert sum(row.closest.memory.values()) > row.work.cluster.usable_memory
    assert [r.name for r in rows if r.best is None] == [_70B_8]
    fig = figures.scenario_plans(rows)
    bars, side = fig.axes[0], fig.axes[1]
    widths = _bar_widths(bars)
    assert sorted(widths) == list(range(len(rows)))
    for y, row in enumerate(rows):
        expected = [row.shown.memory[k] / 1e9 for k in figures.KINDS]
        assert widths[y] == pytest.approx(expected), row.name
    text = _texts(side)
    counts = [t.get_text() for t in side.texts if t.get_fontweight() == "bold" and t.get_text().isdigit()]
    assert counts == [str(len(r.band.choices)) for r in rows if r.band is not None]
    assert f"layouts\nwithin ±{planner_published.error_band():.0%}" in text
    for row in rows:
        if row.best is not None:
            assert str(row.best.plan) in text and f"{row.best.tokens_per_second:,.0f} tokens/s" in text
        else:
            assert str(row.closest.plan) in text and "nothing fits: 1,260 GB of model states > 640 GB" in text
    days = rows[list(planner.SCENARIOS).index(_15T)].days
    assert f"15T tokens in {days:,.0f} days" in text
    title = fig._suptitle.get_text()
    assert "nothing overlapped" not in title and "planner v3" in title
    assert title.startswith("a band, not a winner: the layouts predicted within the planner's "
                            f"±{planner_published.error_band():.0%} error of the fastest (parlab.planner_band.band)")
    cluster = rows[0].work.cluster
    assert f"GEMMs at {cluster.efficiency:.0%} of peak" in title and f"≤ {cluster.headroom:.0%} of HBM" in title
    assert figures.overflow_inches(fig) == 0, "text runs past the figure's edge"


def test_calculator_slide_shows_what_its_code_line_opens():
    from parlab.calculator import report

    figures = _figures_module()
    slide = next(t for t in _slides() if t.startswith("## A calculator to keep"))
    assert f'calculator("{figures.CALCULATOR_SCENARIO}")' in slide
    assert "from parlab.calculator import calculator" in slide
    work = planner.SCENARIOS[figures.CALCULATOR_SCENARIO]
    best = planner.search(work)
    _, html = report(best.plan, work)
    fig = figures.calculator_report()
    [ax] = fig.axes
    assert _bar_widths(ax)[0] == pytest.approx([v / 1e9 for v in best.memory.values()])
    lines = figures.report_lines(html)
    assert len(lines) >= 2 and lines[0].startswith("fits")
    assert all(line in _texts(fig) for line in lines)
    assert figures.overflow_inches(fig) == 0, "text runs past the figure's edge"


def _cp_ep_module():
    return _load("context_expert_figures", SLIDES / "context_expert_figures.py")


CP_EP_SLIDES = {  # the section's slides and the figure each one shows
    "Why context parallelism: activations grow with s": "cp_activations",
    "Ring attention: the queries stay, K and V travel": "ring_steps",
    "Causal masks: balance the ring with a zig-zag split": "causal_balance",
    "Expert parallelism: two all-to-alls per MoE layer": "ep_dispatch",
}


def test_the_context_and_expert_parallel_section_follows_its_divider_with_its_figures(built):
    slides = _slides()
    titles = [re.search(r"^#+ (.+)$", s, re.M).group(1).strip() for s in slides]
    start = titles.index("10 · Beyond the four axes: context and expert parallelism")
    assert titles[start + 1:start + 5] == list(CP_EP_SLIDES)
    assert titles[start + 5] == "11 · What a real configuration sets"
    for title, figure in CP_EP_SLIDES.items():
        slide = slides[titles.index(title)]
        assert f'src="figures/{figure}.png"' in slide, title
        assert re.search(r"Lab 07, (Exercise \d|§\d)", slide), title
        assert f"figures/{figure}.png" in built.images
        assert _notes(title), f"{title!r} has no speaker notes with its sources"
    assert "| 10 | beyond the four axes: context and expert parallelism | Lab 07 |" in slides[titles.index("Today")]


def test_cp_figures_draw_parlab_numbers():
    from parlab.grading.lab07.ring import layout_positions

    figures = _cp_ep_module()
    fig = figures.cp_activations()
    for ax, (scenario, tp) in zip(fig.axes, figures.CP_PANELS):
        model = planner.SCENARIOS[scenario].model
        for line, cp in zip(ax.get_lines(), figures.CPS):
            want = [model.layers * cost.activation_bytes_per_layer(s / cp, 1, model.hidden, model.heads, t=tp,
                                                                   sp=tp > 1, scores=False, **model.shape) / 1e9
                    for s in figures.SEQ]
            assert list(line.get_ydata()) == pytest.approx(want), (scenario, cp)
    # the balance figure: the pairs under the causal mask, counted on lab 07's layouts
    s, c = figures.BALANCE["s"], figures.BALANCE["c"]
    fig = figures.causal_balance()
    L = s // c
    plain = [r * L * L + L * (L + 1) // 2 for r in range(c)]
    assert viz.causal_pairs(layout_positions(s, c, "contiguous")) == plain
    zigzag = viz.causal_pairs(layout_positions(s, c, "zigzag"))
    assert len(set(zigzag)) == 1 and sum(zigzag) == s * (s + 1) // 2
    bars = [ax for ax in fig.axes if ax.patches]
    mean = sum(plain) / c
    assert [p.get_height() for p in bars[0].patches] == pytest.approx([x / mean for x in plain])
    assert [p.get_height() for p in bars[1].patches] == pytest.approx([1.0] * c)
    assert f"max ÷ mean = {max(plain) / mean:.2f}" in _texts(fig) and "max ÷ mean = 1.00" in _texts(fig)
    big = viz.causal_pairs(layout_positions(4 * 4096, 4, "contiguous"))
    assert round(max(big) / (sum(big) / 4), 2) == 1.75  # the slide's limit (2c − 1)/c
    with pytest.raises(ValueError, match="permutation"):
        viz.causal_pairs([[0, 1], [1, 2]])


def test_ring_and_all_to_all_figures_show_lab_07s_schedule_and_routing():
    import torch
    from parlab.models.moe import route, tiny_moe

    figures = _cp_ep_module()
    text = _texts(figures.ring_steps(4))
    for r in range(4):
        for step in range(4):
            assert f"Q{r}·K{(r - step) % 4}ᵀ, V{(r - step) % 4}" in text
    ep = figures.EP
    per = ep["experts"] // ep["ranks"]
    moe = tiny_moe(ep["d"], 2 * ep["d"], ep["experts"], ep["top_k"], seed=ep["seed"])
    routing = figures.ep_routing()
    for rank, got in enumerate(routing):
        x = torch.randn(ep["tokens"], ep["d"], generator=torch.Generator().manual_seed(100 + rank),
                        dtype=torch.float64)
        expert = route(moe.router, x, ep["top_k"])[0]
        want = sorted((int(t), int(e)) for t in range(ep["tokens"]) for e in expert[t])
        assert sorted(got["rows"]) == want
        assert [e for _, e in got["rows"]] == sorted(e for _, e in got["rows"])  # sorted by expert
        assert got["to"] == [sum(1 for _, e in want if e // per == j) for j in range(ep["ranks"])]
    text = _texts(figures.ep_dispatch())
    for rank, got in enumerate(routing):
        assert f"counts first: {got['to']} rows to ranks" in text
    assert any(len(set(r["to"])) > 1 for r in routing), "the example should show uneven splits"


LAB08_SLIDES = {  # lab 08's section (issue 44): its slides and the figure a slide shows
    "Five settings beyond the four axes": None,
    "Recomputation: keep less, compute it again": None,
    "Loss scaling: skip together": None,
    "Clipping: norms don't add": None,
    "Checkpoints reshard": "checkpoint_reshard",
    "HSDP: shard inside a node, replicate across nodes": None,
}


def test_the_real_configuration_section_states_parlab_and_torch_numbers(built):
    import inspect

    import torch

    slides = _slides()
    titles = [re.search(r"^#+ (.+)$", s, re.M).group(1).strip() for s in slides]
    start = titles.index("11 · What a real configuration sets")
    assert titles[start + 1:start + 1 + len(LAB08_SLIDES)] == list(LAB08_SLIDES)
    assert titles[start + 1 + len(LAB08_SLIDES)].startswith("12 · Hands-on")
    assert "| 11 | what a real configuration sets | Lab 08 |" in slides[titles.index("Today")]
    text = {title: slides[titles.index(title)] for title in LAB08_SLIDES}
    for title, figure in LAB08_SLIDES.items():
        assert re.search(r"Lab 08, (Exercises? \d|§\d)", text[title]), title
        assert _notes(title), f"{title!r} has no speaker notes with its sources"
        if figure:
            assert f'src="figures/{figure}.png"' in text[title] and f"figures/{figure}.png" in built.images
    # recomputation: Korthikanti's units and the 70B-class layer, from parlab.cost
    s, b, h, a = 4096, 1, 8192, 64
    keep, full = (cost.activation_bytes_per_layer(s, b, h, a, scores=False, recompute=r) for r in (False, "full"))
    recompute = text["Recomputation: keep less, compute it again"]
    assert f"**{full / (s * b * h):.0f}·sbh** bytes in 16 bits instead of **{keep / (s * b * h):.0f}·sbh**" in recompute
    assert f"**{keep / 1e9:.2f} GB → {full / 1e9:.2f} GB**" in recompute
    # loss scaling: fp16's range and GradScaler's schedule, from torch
    scaling = text["Loss scaling: skip together"]
    assert f"fp16's largest value is **{torch.finfo(torch.float16).max:,.0f}**" in scaling
    assert torch.tensor(2.0 ** -24).half().item() == 2.0 ** -24 and torch.tensor(2.0 ** -25).half().item() == 0
    defaults = {k: p.default for k, p in inspect.signature(torch.amp.GradScaler).parameters.items()}
    assert (f"S × {defaults['backoff_factor']}; after {defaults['growth_interval']:,} steps without one, "
            f"S × {defaults['growth_factor']:g}") in scaling
    assert defaults["init_scale"] == 2.0 ** 16 and "starts at S = 2¹⁶" in scaling
    # checkpoints: the figure's split is FSDP2's, torch.chunk padded with empty shards
    figures = _load("real_config_figures", SLIDES / "real_config_figures.py")
    for rows, n in ((7, 3), (7, 2), (7, 4), (2, 3), (5, 4), (8, 4)):
        chunks = [len(c) for c in torch.chunk(torch.arange(rows), n)]
        assert [stop - first for first, stop in figures.shard_rows(rows, n)] == chunks + [0] * (n - len(chunks))
    sizes = {rn: ", ".join(str(stop - first) for first, stop in figures.shard_rows(*rn)) for rn in ((7, 3), (2, 3))}
    assert f"R = 7, N = 3 → **{sizes[7, 3]}**; R = 2, N = 3 → **{sizes[2, 3]}**" in text["Checkpoints reshard"]
    fig_text = _texts(figures.checkpoint_reshard())
    for n in (figures.RESHARD["saved"], *figures.RESHARD["loaded"]):
        for rank, (first, stop) in enumerate(figures.shard_rows(figures.RESHARD["rows"], n)):
            held = f"row {first}" if stop == first + 1 else f"rows {first}–{stop - 1}"
            assert f"rank {rank}: {held}" in fig_text, (n, rank)
    assert _figures_module().overflow_inches(figures.checkpoint_reshard()) == 0
    # HSDP: 7B on 8 nodes of 8 GPUs, against parlab.cost
    hsdp = text["HSDP: shard inside a node, replicate across nodes"]
    psi, groups, per = 7e9, 8, 8
    comm, fsdp = cost.hsdp_comm_elems(psi, groups, per), cost.zero3_comm_elems(psi, groups * per)
    assert (f"FSDP over {groups * per}: **{cost.zero_memory_per_gpu(psi, groups * per, 3) / 1e9:.2f} GB** per GPU, "
            f"**{fsdp / 1e9:.1f}·10⁹** elements per rank") in hsdp
    assert (f"HSDP {groups} × {per}: **{cost.hsdp_memory_per_gpu(psi, groups, per) / 1e9:.0f} GB**, "
            f"**{comm['shard'] / 1e9:.1f}·10⁹** elements over NVLink and **{comm['replicate'] / 1e9:.2f}·10⁹** "
            f"across nodes, {fsdp / comm['replicate']:.1f}× fewer") in hsdp
    dp = cost.zero_memory_per_gpu(psi, groups * per, 0)
    assert f"(DP: {dp / 1e9:.0f} GB, no fit.)" in hsdp and dp > cost.H100_MEMORY
    # the table's rows are cost's: HSDP with one group is FSDP, with one rank per group DP
    assert cost.hsdp_comm_elems(psi, 1, 64) == {"shard": fsdp, "replicate": 0}
    assert cost.hsdp_comm_elems(psi, 64, 1) == {"shard": 0, "replicate": cost.dp_comm_elems(psi, 64)}
