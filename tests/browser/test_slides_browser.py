"""Browser tier: the built lecture deck in real Chromium, every slide.

Builds the HTML deck (no PDF) into a temporary folder and opens it from
file://, so nothing is served and any attempt to reach the network shows up
as a request that is not file:.  It steps through every slide with reveal's
API and fails on a JavaScript error, a console error, a failed or remote
request, a broken image, or a slide whose content is taller than the slide.
Screenshots of the first slide and of the chosen ones (CHOSEN) go to
test-artifacts/slides/ (git-ignored) for a person to look at.  A second test
prints the PDF handout as ``make slides`` does and counts its pages.

Independent of the JupyterLab fixtures in this folder: it starts its own
Chromium through Playwright (the system binary, never a downloaded one).
"""
from __future__ import annotations

import importlib.util
import json
import re
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.browser

REPO = Path(__file__).resolve().parents[2]
ARTIFACTS = REPO / "test-artifacts" / "slides"
# besides the first slide: those that carry the deck's densest figures
CHOSEN = ("Ring all-reduce, step by step", "GPipe and 1F1B: same bubble, less memory",
          "9 · Practical scenarios: choosing the axes", "What the planner says: six scenarios on H100s",
          "70B on 64: a band, not a winner",
          "A calculator to keep")
SLACK_PX = 4  # rounding in reveal's layout


def _load_build():
    """slides/build.py as a module (slides/ is not a package)."""
    name = "parlab_slides_build"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, REPO / "slides" / "build.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # its dataclasses look themselves up there
        spec.loader.exec_module(module)
    return sys.modules[name]


@pytest.fixture(scope="module")
def deck(tmp_path_factory):
    build = _load_build()
    return build, build.build(tmp_path_factory.mktemp("deck"), pdf=False)


SLIDE_STATE = """() => {
    const slide = Reveal.getCurrentSlide();
    const imgs = [...slide.querySelectorAll('img')];
    return {
        h: Reveal.getIndices().h,
        title: (slide.querySelector('h1, h2') || {}).textContent || '',
        height: slide.scrollHeight,
        broken: imgs.filter(i => !(i.complete && i.naturalWidth > 0)).map(i => i.getAttribute('src')),
        images: imgs.length,
    };
}"""


def test_every_slide_renders_offline_without_errors(deck):
    from playwright.sync_api import sync_playwright

    build, built = deck
    chromium = build.find_chromium()
    assert chromium, "tests/conftest.py found a Chromium, but slides/build.py did not"
    errors, remote = [], []
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium, args=build.CHROMIUM_FLAGS)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 720})
            page.on("pageerror", lambda e: errors.append(f"pageerror: {e}"))
            page.on("console", lambda m: errors.append(f"console {m.type}: {m.text}")
                    if m.type == "error" else None)
            page.on("requestfailed", lambda r: errors.append(f"request failed: {r.url} ({r.failure})"))
            page.on("request", lambda r: remote.append(r.url)
                    if not r.url.startswith(("file:", "data:")) else None)
            page.goto(built.html.resolve().as_uri())
            page.wait_for_function("() => window.Reveal && Reveal.isReady()")
            total = page.evaluate("Reveal.getHorizontalSlides().length")
            assert total == built.slides, (total, built.slides)
            config_height = page.evaluate("Reveal.getConfig().height")
            seen, too_tall, broken, shots = [], [], [], {}
            for h in range(total):
                page.evaluate(f"Reveal.slide({h}, 0)")
                page.wait_for_function(f"() => Reveal.getIndices().h === {h}")
                page.wait_for_function("() => [...Reveal.getCurrentSlide().querySelectorAll('img')]"
                                       ".every(i => i.complete)")
                state = page.evaluate(SLIDE_STATE)
                seen.append(state["h"])
                broken += [f"slide {h + 1}: {src}" for src in state["broken"]]
                if state["height"] > config_height + SLACK_PX:
                    too_tall.append(f"slide {h + 1} ({state['title']!r}): {state['height']} px "
                                    f"> {config_height} px")
                title = state["title"].replace("¶", "").strip()
                if h == 0 or title in CHOSEN:
                    name = "01-first" if h == 0 else f"{h + 1:02d}-{title.split(',')[0].split(':')[0]}"
                    path = ARTIFACTS / (name.replace(" ", "-").lower() + ".png")
                    page.screenshot(path=str(path))
                    shots[title] = path
        finally:
            browser.close()
    assert seen == list(range(total)), "reveal did not visit every slide in order"
    assert not errors, "JavaScript errors while stepping through the deck:\n" + "\n".join(errors)
    assert not remote, "the deck reached for the network:\n" + "\n".join(remote)
    assert not broken, "broken images:\n" + "\n".join(broken)
    assert not too_tall, "slides whose content does not fit:\n" + "\n".join(too_tall)
    missing = [t for t in CHOSEN if t not in shots]
    assert not missing, f"no slide titled {missing}: update CHOSEN to titles the deck has"
    for path in shots.values():
        assert path.stat().st_size > 10_000, f"{path} looks empty"


def _slides_with_notes() -> int:
    cells = json.loads((REPO / "slides" / "lecture.ipynb").read_text(encoding="utf-8"))["cells"]
    kinds = [c["metadata"].get("slideshow", {}).get("slide_type", "-") for c in cells]
    starts = [i for i, k in enumerate(kinds) if k in ("slide", "subslide")] + [len(kinds)]
    return sum("notes" in kinds[a:b] for a, b in zip(starts, starts[1:]))


def test_pdf_handout_has_every_slide_and_a_page_of_notes_for_each(deck):
    """What make slides prints: one page per slide, plus one for each slide's speaker notes."""
    build, built = deck
    pdf = build.print_pdf(built.html, build.find_chromium())
    data = pdf.read_bytes()
    assert data.startswith(b"%PDF")
    pages = len(re.findall(rb"/Type\s*/Page(?!s)", data))  # Chromium writes one object per page
    assert pages == built.slides + _slides_with_notes(), (pages, built.slides, _slides_with_notes())
    assert len(data) > 200_000, "the handout is too small to hold the figures"
