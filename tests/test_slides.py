"""The lecture deck: it builds, works offline, and agrees with the labs and parlab.cost.

Tier ``unit``: the build runs in this process (matplotlib for the figures,
nbconvert's SlidesExporter as a library) and starts no process; the PDF,
which needs Chromium, is left to ``make slides``.  The browser tier
(tests/browser/test_slides_browser.py) steps through the built deck in Chromium.
"""
from __future__ import annotations

import importlib.util
import json
import re
import sys
from pathlib import Path

import pytest

from parlab import cost

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[1]
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
    assert 30 <= built.slides <= 45, f"{built.slides} slides; the lecture plan is 30-45"
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
            for lab, what in re.findall(r"Lab (\d\d), (Exercises? [\w–, and]+)", line):
                assert lab in labs, f"slide {i}: {line!r}"
                for ex in re.findall(r"\d+[a-z]?", what):
                    assert f"Exercise {ex}" in labs[lab], \
                        f"slide {i} cites Lab {lab} Exercise {ex}, which its notebook does not have"


def test_every_content_slide_with_a_lab_topic_names_its_lab():
    """Slides after the opening that are not section dividers carry a lab line, except the
    few that are about no single lab (listed here on purpose)."""
    general = {"What each axis splits", "What each axis costs", "Choosing the axes",
               "One DGX H100 node", "What to remember", "References", "Today",
               "Parallelism fundamentals for training", "Running the labs on the DGX"}
    for i, text in enumerate(_slides(), start=1):
        title = re.search(r"^#+ (.+)$", text, re.M).group(1).strip()
        divider = re.match(r"\d+ · ", title)
        if divider or title in general:
            continue
        assert re.search(r"Lab \d\d", text), f"slide {i} ({title!r}) names no lab"


@pytest.mark.parametrize("snippet, value", [
    ("**1,120 GB**", cost.training_bytes(70e9).total / 1e9),
    ("**140 GB**", cost.weights_bytes(70e9) / 1e9),
    ("**120 → 31.4 → 16.6 → 1.9 GB**", [cost.zero_memory_per_gpu(7.5e9, 64, s) / 1e9 for s in range(4)]),
    ("**17.5 GB**", cost.zero_memory_per_gpu(70e9, 64, 3) / 1e9),
    ("| 6.51 GB |", cost.activation_bytes_per_layer(4096, 1, 8192, 64) / 1e9),
    ("| 0.81 GB |", cost.activation_bytes_per_layer(4096, 1, 8192, 64, t=8, sp=True) / 1e9),
    ("| 0.47 GB |", cost.comm_bytes(cost.tp_comm_elems_per_layer(1, 4096, 8192, 8)) / 1e9),
    ("| 27.3 % |", 100 * cost.bubble_fraction(4, 8)),
    ("**180 days**", cost.time_to_train(70e9, 15e12, 1024) / cost.SECONDS_PER_DAY),
])
def test_numbers_on_the_slides_are_parlab_cost_numbers(snippet, value):
    deck = "\n".join(_slides())
    assert snippet in deck, f"{snippet!r} is no longer on any slide: update this test with the slide"
    shown = [float(x.replace(",", "")) for x in re.findall(r"\d[\d,]*\.?\d*", snippet)]
    expected = value if isinstance(value, list) else [value]
    assert len(shown) == len(expected), (shown, expected)
    for s, e in zip(shown, expected):
        digits = len(str(s).split(".")[1].rstrip("0")) if "." in str(s) else 0
        assert abs(s - e) <= 0.51 * 10 ** -digits, f"slide says {s}, parlab.cost gives {e:.4g}"


def test_ideal_schedules_have_the_formula_bubble_and_memory():
    schedules = _load("parlab_slides_schedules", SLIDES / "schedules.py")
    for p, m in ((4, 8), (2, 3), (4, 2), (3, 7)):
        for name in ("gpipe", "1f1b"):
            spans = schedules.simulate(schedules.stage_orders(name, p, m), fwd=1.0, bwd=2.0)
            total = max(s["end"] for s in spans)
            busy = sum(s["end"] - s["start"] for s in spans) / p
            assert abs((1 - busy / total) - cost.bubble_fraction(p, m)) < 1e-12, (name, p, m)
            held = schedules.peak_in_flight(spans, stage=0)
            assert held == (m if name == "gpipe" else cost.activations_held(p, m, "1f1b", 0))
    with pytest.raises(ValueError, match="deadlock"):
        schedules.simulate([[("B", 0), ("F", 0)], [("F", 0), ("B", 0)]])
