"""Build the lecture deck: figures, offline HTML slides and a PDF handout.

    .venv/bin/python slides/build.py              # or: make slides
    .venv/bin/python slides/build.py --no-pdf     # HTML only
    .venv/bin/python slides/build.py --out DIR    # somewhere else than slides/build/

Steps:
1. Draw every figure from parlab into slides/figures/ (make_figures.py and
   figures.py), where the notebook finds them when presented with RISE.
2. Export slides/lecture.ipynb with nbconvert's SlidesExporter (what
   ``jupyter nbconvert --to slides`` runs) through templates/parlab-reveal,
   which loads reveal.js from a local copy instead of a CDN.
3. Copy reveal.js (from the sphinx-revealjs package, which ships reveal.js
   5.x under the MIT licence) and the figures next to the HTML.
4. Check that the HTML needs nothing from the network and that every file it
   references exists and is not empty.
5. Print the deck to PDF with headless Chromium (driven by Playwright, no
   browser download) through reveal's ``?print-pdf`` view, speaker notes on
   pages of their own.  Without Chromium or Playwright the PDF is skipped,
   and the build says so and why.
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import sys
import time
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path

HERE = Path(__file__).resolve().parent
DECK = HERE / "lecture.ipynb"
FIGURES = HERE / "figures"
TEMPLATES = HERE / "templates"
DEFAULT_OUT = HERE / "build"
HTML_NAME = "lecture.slides.html"
PDF_NAME = "lecture.pdf"
REVEAL_DIR = "reveal.js"
CHROMIUM_FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--no-first-run"]


class BuildError(RuntimeError):
    """The deck cannot be built; the message says what to do."""


@dataclass
class Deck:
    """What a build produced and what its HTML references."""

    html: Path
    slides: int
    images: list[str]
    scripts: list[str]
    stylesheets: list[str]
    pdf: Path | None = None
    pdf_skipped: str | None = None
    seconds: dict[str, float] = field(default_factory=dict)


# ---------------------------------------------------------------- inputs

def reveal_source() -> Path:
    """reveal.js as shipped inside the sphinx-revealjs package."""
    try:
        import sphinx_revealjs
    except ImportError as e:
        raise BuildError("reveal.js comes from the sphinx-revealjs package, which is not installed: "
                         "run `.venv/bin/pip install -e '.[slides]'` (make slides does this)") from e
    root = Path(sphinx_revealjs.__file__).parent / "_static" / "revealjs"
    if not (root / "dist" / "reveal.js").is_file():
        raise BuildError(f"no dist/reveal.js under {root}: this sphinx-revealjs version lays reveal.js "
                         "out differently; pin the version named in pyproject.toml")
    return root


_MATH = re.compile(r"\$[^$\n]+\$")


def check_source(nb) -> None:
    """The offline deck has no MathJax, so the notebook must not use $...$ LaTeX."""
    for i, cell in enumerate(nb.cells):
        if cell.cell_type == "markdown" and _MATH.search(cell.source):
            raise BuildError(f"cell {i} of {DECK.name} uses $...$ LaTeX, which the offline HTML "
                             "cannot render (no MathJax): write the formula in Unicode "
                             f"(Ψ, ×, ·, ², −): {_MATH.search(cell.source).group(0)!r}")


# ---------------------------------------------------------------- steps

def draw_figures() -> list[Path]:
    """Regenerate every figure into slides/figures/."""
    sys.path.insert(0, str(HERE))
    try:
        import figures
        import make_figures
    finally:
        sys.path.remove(str(HERE))
    make_figures.main()
    return [Path(p) for p in figures.render(str(FIGURES))]


def export_html(out: Path) -> Path:
    """slides/lecture.ipynb -> out/lecture.slides.html (nbconvert's SlidesExporter)."""
    import nbformat
    from nbconvert.exporters import SlidesExporter
    from traitlets.config import Config

    nb = nbformat.read(DECK, as_version=4)
    check_source(nb)
    config = Config()
    config.SlidesExporter.template_name = "parlab-reveal"
    config.SlidesExporter.extra_template_basedirs = [str(TEMPLATES)]
    config.SlidesExporter.reveal_url_prefix = REVEAL_DIR
    config.SlidesExporter.reveal_width = "1280"
    config.SlidesExporter.reveal_height = "720"
    config.SlidesExporter.reveal_theme = "white"  # its fonts ship with reveal.js; "simple" loads Google Fonts
    config.SlidesExporter.reveal_transition = "none"
    config.SlidesExporter.reveal_number = "c/t"
    config.SlidesExporter.exclude_input_prompt = True
    body, _ = SlidesExporter(config=config).from_notebook_node(
        nb, resources={"metadata": {"name": DECK.stem, "path": str(HERE)}})
    html = out / HTML_NAME
    html.write_text(body, encoding="utf-8")
    return html


def copy_assets(out: Path) -> None:
    """reveal.js (without source maps and the ES-module build) and the figures, next to the HTML."""
    src = reveal_source()
    dst = out / REVEAL_DIR
    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(src / "dist", dst / "dist", ignore=shutil.ignore_patterns("*.map", "*.esm.js"))
    shutil.copytree(src / "plugin" / "notes", dst / "plugin" / "notes")
    shutil.copy2(src / "LICENSE", dst / "LICENSE")
    shutil.rmtree(out / "figures", ignore_errors=True)
    shutil.copytree(FIGURES, out / "figures")


class _References(HTMLParser):
    """Top-level <section>s of the deck and every src/href the page loads."""

    def __init__(self):
        super().__init__()
        self.depth = 0
        self.slides = 0
        self.images: list[str] = []
        self.scripts: list[str] = []
        self.stylesheets: list[str] = []
        self.inline_css: list[str] = []
        self._in_style = False

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "section":
            self.depth += 1
            self.slides += self.depth == 1
        elif tag == "img" and a.get("src"):
            self.images.append(a["src"])
        elif tag == "script" and a.get("src"):
            self.scripts.append(a["src"])
        elif tag == "link" and a.get("href"):
            self.stylesheets.append(a["href"])
        elif tag == "style":
            self._in_style = True

    def handle_endtag(self, tag):
        if tag == "section":
            self.depth -= 1
        elif tag == "style":
            self._in_style = False

    def handle_data(self, data):
        if self._in_style:
            self.inline_css.append(data)


_REMOTE = re.compile(r"^(https?:)?//", re.I)
_CSS_URL = re.compile(r"""@import\s+(?:url\()?\s*['"]?([^'")\s;]+)|url\(\s*['"]?([^'")]+)""", re.I)


def _css_urls(css: str) -> list[str]:
    return [a or b for a, b in _CSS_URL.findall(css)]


def check_offline(html: Path) -> Deck:
    """Every script, stylesheet, font and image is a local, non-empty file next to the HTML."""
    refs = _References()
    refs.feed(html.read_text(encoding="utf-8"))
    problems = []
    local_css = []
    for url in refs.scripts + refs.stylesheets + refs.images + [
            u for css in refs.inline_css for u in _css_urls(css)]:
        if url.startswith("data:"):
            continue
        if _REMOTE.match(url):
            problems.append(f"{url} is loaded from the network")
            continue
        path = html.parent / url.split("?")[0].split("#")[0]
        if not path.is_file() or path.stat().st_size == 0:
            problems.append(f"{url} is missing or empty ({path})")
        elif path.suffix == ".css":
            local_css.append(path)
    for css in local_css:  # one level of @import / url() inside the local stylesheets
        for url in _css_urls(css.read_text(encoding="utf-8", errors="replace")):
            if url.startswith("data:") or url.startswith("#"):
                continue
            if _REMOTE.match(url):
                problems.append(f"{css.name} loads {url} from the network")
            elif not (css.parent / url.split("?")[0].split("#")[0]).is_file():
                problems.append(f"{css.name} refers to {url}, which is missing")
    if refs.slides == 0:
        problems.append("the HTML has no <section>: no slides were exported")
    if problems:
        raise BuildError(f"{html} is not a complete offline deck:\n  " + "\n  ".join(problems))
    return Deck(html=html, slides=refs.slides, images=refs.images, scripts=refs.scripts,
                stylesheets=refs.stylesheets)


def find_chromium() -> str | None:
    """Chromium from $PARLAB_CHROMIUM or the PATH, or None."""
    for name in (os.environ.get("PARLAB_CHROMIUM"), "chromium", "chromium-browser", "google-chrome"):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


def print_pdf(html: Path, chromium: str, timeout: float = 180) -> Path:
    """Chromium prints reveal's ?print-pdf view to out/lecture.pdf, driven by Playwright.

    Chromium's own ``--print-to-pdf`` prints this deck either before reveal
    has laid out the pages (one page) or, with ``--virtual-time-budget``,
    88 blank pages; so the build waits for reveal's print layout, the fonts
    and every image in a real page, then prints it.
    """
    try:
        from playwright.sync_api import Error as PlaywrightError
        from playwright.sync_api import sync_playwright
    except ImportError as e:
        raise _Skip("the playwright Python package is not installed (`.venv/bin/pip install -e "
                    "'.[slides]'`; it drives the system Chromium, no browser download)") from e
    pdf = html.parent / PDF_NAME
    pdf.unlink(missing_ok=True)
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=chromium, args=CHROMIUM_FLAGS,
                                        timeout=timeout * 1000)
            try:
                page = browser.new_page()
                page.goto(html.resolve().as_uri() + "?print-pdf", timeout=timeout * 1000)
                page.wait_for_function(PRINT_READY, timeout=timeout * 1000)
                pages = page.evaluate("document.querySelectorAll('.pdf-page').length")
                page.pdf(path=str(pdf), prefer_css_page_size=True, print_background=True)
            finally:
                browser.close()
    except PlaywrightError as e:
        raise BuildError(f"Chromium ({chromium}) could not print the PDF: {e}") from e
    if pages == 0 or not pdf.is_file() or pdf.stat().st_size == 0:
        raise BuildError(f"Chromium wrote no PDF, or reveal laid out no pages ({pages})")
    return pdf


# reveal has laid out its print pages, the fonts are loaded and every image is decoded
PRINT_READY = """() => window.Reveal && Reveal.isReady()
    && document.querySelectorAll('.pdf-page').length > 0
    && document.fonts.status === 'loaded'
    && [...document.images].every(i => i.complete && i.naturalWidth > 0)"""


class _Skip(Exception):
    """The PDF cannot be made on this machine; the message says why."""


# ---------------------------------------------------------------- the build

def build(out: Path = DEFAULT_OUT, pdf: bool = True) -> Deck:
    """Every step above; raises BuildError with what to do when one fails."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    seconds = {}
    t = time.perf_counter()
    draw_figures()
    seconds["figures"] = time.perf_counter() - t
    t = time.perf_counter()
    html = export_html(out)
    copy_assets(out)
    deck = check_offline(html)
    seconds["html"] = time.perf_counter() - t
    if pdf:
        chromium = find_chromium()
        if chromium is None:
            deck.pdf_skipped = ("no Chromium found (install it, e.g. `apt-get install chromium`, "
                                "or set PARLAB_CHROMIUM to its path)")
        else:
            t = time.perf_counter()
            try:
                deck.pdf = print_pdf(html, chromium)
            except _Skip as e:
                deck.pdf_skipped = str(e)
            seconds["pdf"] = time.perf_counter() - t
    else:
        deck.pdf_skipped = "--no-pdf was given"
    deck.seconds = seconds
    return deck


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="build folder (default slides/build)")
    parser.add_argument("--no-pdf", action="store_true", help="build the HTML only")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    try:
        deck = build(args.out, pdf=not args.no_pdf)
    except BuildError as e:
        print(f"slides: build failed: {e}", file=sys.stderr)
        return 1
    print(f"slides: {deck.slides} slides, {len(deck.images)} images -> {deck.html}")
    if deck.pdf:
        print(f"slides: PDF handout, {deck.pdf.stat().st_size / 1e6:.1f} MB -> {deck.pdf}")
    else:
        print(f"slides: PDF handout SKIPPED: {deck.pdf_skipped}")
    steps = ", ".join(f"{k} {v:.1f} s" for k, v in deck.seconds.items())
    print(f"slides: built in {time.perf_counter() - start:.1f} s ({steps})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
