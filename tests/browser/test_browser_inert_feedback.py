"""No live HTML from a submission: its feedback and the formgrader's page of it, opened in Chromium, run nothing.

One lab 00 submission, cut to its test cells and the ``weight_bytes``
answer (the solution's), which also displays HTML with a ``<script>`` and
an ``<img onerror>``, JavaScript and an SVG; after it, a markdown cell of
the student's holding a ``<script>`` and an ``<img onerror>``.  Each piece
of script, if it ran, would set the page's title, add an element
``#pwned-<where>``, log a line, and write ``pwned-<where>.txt`` into the
course through the Jupyter server's contents API with the page's
``_xsrf`` cookie, as a student's script could before this fix.

The course is graded once for the module by ``parlab grade``'s worker
(``python -m parlab.classgrade.worker``: ``nbgrader autograde`` then
``generate_feedback`` in one process) with the repository's course config
and two recording steps of the test's own: the notebook as the kernel left
it (right before ``InertOutputs``), and the settings of the exporter
generate_feedback used.  The instructor's server is a real ``jupyter
server`` started as the hub starts an instructor's (``hub/instructor``'s
config: the formgrader, the course at ``~/parlab``), logged in as after
opening JupyterLab.

- ``test_graded_notebook_holds_only_inert_outputs``: the kernel left
  ``text/html``, ``application/javascript`` and ``image/svg+xml``; the
  stored notebook holds plain text, and the markdown cell as a code block;
  the answer still scores; generate_feedback rendered with the sanitizer.
- ``test_without_the_fix_the_attack_runs_and_writes``: the notebook as the
  kernel left it, rendered by nbgrader's formgrade template as before (no
  sanitizer) on the server's own origin: every piece of script runs and
  writes its file, so the checks of the last two tests can fail.  Then the
  real formgrader (which has the sanitizer) on the same notebook: the
  outputs' scripts are escaped, the markdown cell's still run (nbgrader's
  templates render markdown without the sanitizer: why ``InertOutputs``
  reads markdown too).
- ``test_formgrader_page_runs_nothing_writes_nothing``: the formgrader's
  real page of the graded submission.
- ``test_feedback_runs_nothing_writes_nothing``: the feedback HTML that
  generate_feedback wrote, on the server's own origin (the worst place to
  open it: ``/files/`` adds a CSP sandbox, and a ``file://`` page has no
  cookie).
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from class_course import add_students, gradebook_scores, make_course, notebook, submit, tool_env
from lab_server import REPO, LabServer
from nbgrader_harness import source_notebook
from parlab.classgrade import worker

pytestmark = [pytest.mark.browser, pytest.mark.timeout(300)]
pytest.importorskip("playwright.sync_api", reason="browser tier: playwright is not installed "
                    "(pip install -e '.[browser]')")

LAB = "00-setup"
STUDENT = "mallory"
COURSE = "parlab"  # the course's folder in the instructor's home, as hub/instructor/nbgrader_config.py has it
#: Where each piece of script sits; each writes pwned-<where>.txt if it runs.
FROM_OUTPUTS = ("html-script", "html-onerror", "js")
FROM_MARKDOWN = ("md-script", "md-onerror")
#: In an image's metadata: nbconvert writes its width into the tag unquoted, and sanitize_html leaves it.
FROM_METADATA = ("img-width",)
#: A 1x1 PNG, so that the image loads (and an onload in its tag runs).
DOT_PNG = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg=="


def payload(where: str) -> str:
    """JavaScript that shows it ran and writes a file into the course (single quotes only: it fits in an attribute)."""
    return ("(function(){document.title='PWNED';"
            f"var d=document.createElement('div');d.id='pwned-{where}';document.body.appendChild(d);"
            f"console.log('PWNED {where}');"
            "var m=document.cookie.match(/(?:^|; )_xsrf=([^;]*)/);"
            f"fetch('/api/contents/{COURSE}/pwned-{where}.txt',{{method:'PUT',credentials:'same-origin',"
            "headers:{'Content-Type':'application/json','X-XSRFToken':m?decodeURIComponent(m[1]):''},"
            f"body:JSON.stringify({{type:'file',format:'text',content:'{where}'}})}});}})()")


def width_attack() -> str:
    """An image width that is also an attribute: no space, quote or angle bracket of its own."""
    import base64

    return "1 onload=eval(atob('" + base64.b64encode(payload("img-width").encode()).decode() + "'))"


DISPLAYS = f'''

from IPython.display import HTML, Javascript, display

display(HTML({'<b>shown</b><script>' + payload('html-script') + '</script><img src="x" onerror="'
              + payload('html-onerror') + '">'!r}))
display(Javascript({payload('js')!r}))
display({{"image/svg+xml": {'<svg xmlns="http://www.w3.org/2000/svg" onload="' + payload('svg') + '"/>'!r},
         "text/plain": "an svg"}}, raw=True)
display({{"image/png": {DOT_PNG!r}, "text/plain": "a dot"}}, raw=True,
        metadata={{"image/png": {{"width": {width_attack()!r}}}}})
'''
MARKDOWN = f"""My notes on weight_bytes.

<script>{payload('md-script')}</script>

<img src="x" onerror="{payload('md-onerror')}">
"""
#: The test's own steps, appended to the course's config: the notebook as the kernel left it (right before
#: InertOutputs), and the settings of the exporter generate_feedback renders with.
TEST_STEPS = '''
# (tests/browser/test_browser_inert_feedback.py) two steps that only record
import json as _json

from nbconvert.preprocessors import Preprocessor as _Preprocessor
from nbgrader.converters import GenerateFeedback as _GenerateFeedback


class KeepExecuted(_Preprocessor):
    def preprocess(self, nb, resources):
        import nbformat
        nbformat.write(nb, {executed!r})
        return nb, resources


class RecordExporter(_Preprocessor):
    def preprocess(self, nb, resources):  # a preprocessor's parent is the exporter that runs it
        with open({exporter!r}, "w") as f:
            _json.dump({{"template": self.parent.template_name, "sanitize_html": self.parent.sanitize_html}}, f)
        return nb, resources


c.KeepExecuted.enabled = c.RecordExporter.enabled = True
c.Autograde.autograde_preprocessors.insert(c.Autograde.autograde_preprocessors.index(InertOutputs), KeepExecuted)
c.GenerateFeedback.preprocessors = [*_GenerateFeedback.class_traits()["preprocessors"].default(), RecordExporter]
'''


def hostile_notebook(course: Path) -> nbformat.NotebookNode:
    """Lab 00's solution cut to its test cells and the ``weight_bytes`` answer, which also displays; then our markdown.

    The other answers are left out, so only ``weight_bytes`` is handed in and
    graded (one launch instead of every exercise's: this module's time).
    """
    nb = notebook(LAB, course)
    nb.cells = [c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == "weight_bytes"
                or c.metadata.get("nbgrader", {}).get("grade") and not c.metadata["nbgrader"].get("solution")]
    index, cell = next((i, c) for i, c in enumerate(nb.cells)
                       if c.metadata["nbgrader"]["grade_id"] == "weight_bytes")
    cell.source += DISPLAYS
    nb.cells.insert(index + 1, nbformat.v4.new_markdown_cell(MARKDOWN))
    return nb


class InstructorServer(LabServer):
    """``jupyter server`` as the hub starts an instructor's: hub/instructor's config, in a home holding the course."""

    def __init__(self, root: Path, home: Path):
        super().__init__(root)
        self.notebooks = home

    def _prepare(self) -> None:
        self.tmp.mkdir(parents=True)
        (self.root / "exchange").mkdir()  # the nbgrader exchange the hub names (PARLAB_EXCHANGE)

    def _command(self) -> list[str]:
        return [sys.executable, "-m", "jupyter_server", *self._server_args()]

    def _env(self) -> dict:
        env = super()._env()
        env.update(HOME=str(self.notebooks), JUPYTER_CONFIG_PATH=str(REPO / "hub" / "instructor"),
                   PARLAB_EXCHANGE=str(self.root / "exchange"))
        return env


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    """The hostile submission graded, and the instructor's server on its course."""
    top = tmp_path_factory.mktemp("inert-feedback")
    home = top / "home"
    course = make_course(home / COURSE, [LAB])
    executed, exporter = top / "executed.ipynb", top / "feedback-exporter.json"
    with open(course / "nbgrader_config.py", "a") as config:
        config.write(TEST_STEPS.format(executed=str(executed), exporter=str(exporter)))
    add_students(course, [STUDENT])
    submit(course, STUDENT, LAB, hostile_notebook(course))
    # parlab grade's worker, on this course: autograde then generate_feedback, in one process
    grading = subprocess.Popen(worker.command(course, LAB, STUDENT), cwd=course, env=tool_env(),
                               stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        server = InstructorServer(top / "server", home).start()  # while it grades
    finally:
        log = grading.communicate(timeout=600)[0]
    name = source_notebook(LAB).name
    try:
        assert grading.returncode == 0, log[-4000:]
        yield {"home": home, "course": course, "server": server, "executed": executed, "exporter": exporter,
               "autograded": course / "autograded" / STUDENT / LAB / name,
               "feedback": course / "feedback" / STUDENT / LAB / name.replace(".ipynb", ".html")}
    finally:
        server.stop()


# ---------------------------------------------------------------- what a page did
def course_digest(course: Path) -> dict[str, str]:
    """Every file of the course and its content's hash (the gradebook aside: the formgrader reads it)."""
    return {str(p.relative_to(course)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(course.rglob("*")) if p.is_file() and not p.name.startswith("gradebook.db")}


def written(graded) -> list[str]:
    """The files the payloads wrote, anywhere in the instructor's home."""
    return sorted(p.name for p in graded["home"].rglob("pwned-*"))


def log_in(page, server) -> None:
    """The instructor's session, as after opening JupyterLab: a login cookie for the whole server, and
    the ``_xsrf`` cookie (which a page's script can read) from a formgrader page."""
    page.goto(f"{server.url}/api/status?token={server.token}")
    page.goto(f"{server.url}/formgrader/gradebook")
    cookies = {c["name"]: c["path"] for c in page.context.cookies()}
    assert cookies.get("_xsrf") == "/" and "/" in [p for n, p in cookies.items() if n.startswith("username-")], cookies


def visit(page, url: str) -> dict:
    """Open ``url``, wait until its requests are done; what shows that a payload ran."""
    logged: list[str] = []
    page.on("console", lambda message: logged.append(message.text))
    page.on("pageerror", lambda error: logged.append(str(error)))
    page.goto(url, wait_until="load")
    page.wait_for_load_state("networkidle")
    return {"title": page.title(),
            "markers": sorted(page.eval_on_selector_all("[id^=pwned-]", "els => els.map(e => e.id)")),
            "logged": [line for line in logged if "PWNED" in line],
            "text": page.inner_text("body")}


def serve(page, server, name: str, html: str) -> str:
    """A URL on the instructor server's own origin that answers ``html`` (no CSP sandbox, the server's cookies)."""
    url = f"{server.url}/parlab-test/{name}.html"
    page.route(url, lambda route: route.fulfill(status=200, content_type="text/html", body=html))
    return url


def only_local(page) -> None:
    """No request leaves the machine (MathJax from a CDN): refused at once rather than waited for."""
    page.route(re.compile(r"^https?://(?!127\.0\.0\.1[:/])"), lambda route: route.abort())


def render(nb_path: Path) -> str:
    """The notebook as nbgrader's formgrade template rendered it before this fix (no sanitizer)."""
    from nbconvert.exporters import HTMLExporter
    from nbgrader.server_extensions.formgrader import handlers
    from traitlets.config import Config

    config = Config()
    config.HTMLExporter.template_name = "formgrade"
    config.HTMLExporter.extra_template_basedirs = [handlers.template_path]
    resources = {"base_url": "", "notebook_id": nb_path.stem, "submission_id": "x", "index": 0, "total": 1}
    return HTMLExporter(config=config).from_filename(str(nb_path), resources=resources)[0]


def formgrader_url(graded) -> str:
    """The formgrader's page of the submission (by its id in the gradebook)."""
    from nbgrader.api import Gradebook

    with Gradebook(f"sqlite:///{graded['course'] / 'gradebook.db'}", "parlab") as gb:
        submission = gb.find_submission_notebook(source_notebook(LAB).stem, LAB, STUDENT).id
    return f"{graded['server'].url}/formgrader/submissions/{submission}/"


def instructor_page(graded, chromium):
    page = chromium.new_page()
    only_local(page)
    log_in(page, graded["server"])
    return page


def assert_inert(seen: dict, graded, before: dict) -> None:
    assert seen["title"] != "PWNED" and not seen["markers"] and not seen["logged"], seen
    assert not written(graded)
    assert course_digest(graded["course"]) == before


def assert_ran(seen: dict, graded, where: tuple) -> None:
    """Exactly the payloads at ``where`` ran and wrote their files (then removed, for the tests after)."""
    assert seen["title"] == "PWNED" and seen["markers"] == sorted(f"pwned-{w}" for w in where), seen
    assert sorted(f"PWNED {w}" for w in where) == sorted(seen["logged"]), seen
    assert written(graded) == sorted(f"pwned-{w}.txt" for w in where)  # answered: networkidle waited
    for path in graded["home"].rglob("pwned-*"):
        path.unlink()


# ---------------------------------------------------------------- the tests
def test_graded_notebook_holds_only_inert_outputs(graded):
    kernel_left = nbformat.read(graded["executed"], as_version=4)
    stored = nbformat.read(graded["autograded"], as_version=4)

    def kinds(nb):
        return {kind for cell in nb.cells if cell.cell_type == "code" for out in cell.outputs
                for kind in out.get("data", {})}

    # what the kernel left holds the live types (so the assertions below could fail) ...
    assert {"text/html", "application/javascript", "image/svg+xml"} <= kinds(kernel_left), kinds(kernel_left)
    assert any("<script>" + payload("html-script") in str(out.get("data", {}).get("text/html", ""))
               for cell in kernel_left.cells if cell.cell_type == "code" for out in cell.outputs)
    # ... what grading stored holds plain text only, and the markdown cell's HTML as a code block
    assert kinds(stored) <= {"text/plain", "image/png", "image/jpeg"}, kinds(stored)
    # the dot's width, an attribute of the student's, is gone; the dot is kept
    dots = [out for nb in (kernel_left, stored) for cell in nb.cells if cell.cell_type == "code"
            for out in cell.outputs if out.get("data", {}).get("text/plain") == "a dot"]
    assert [d["metadata"] for d in dots] == [{"image/png": {"width": width_attack()}}, {}], dots
    assert dots[1]["data"]["image/png"] == DOT_PNG
    (notes,) = [c for c in stored.cells if c.cell_type == "markdown" and "My notes" in c.source]
    assert notes.source.startswith("*parlab: this cell held HTML") and "\n```\nMy notes" in notes.source, notes.source
    # the displays cost nothing: the answer is still right
    assert gradebook_scores(graded["course"], LAB)[STUDENT]["weight_bytes-test"] == (1.0, 1.0)
    # and generate_feedback rendered with the sanitizer, in nbgrader's feedback template
    assert json.loads(graded["exporter"].read_text()) == {"template": "feedback", "sanitize_html": True}


def test_without_the_fix_the_attack_runs_and_writes(graded, chromium):
    """The notebook as the kernel left it: live before (no sanitizer); in the formgrader, the markdown and
    the image's width still live (sanitize_html covers neither)."""
    page = instructor_page(graded, chromium)
    seen = visit(page, serve(page, graded["server"], "before", render(graded["executed"])))
    assert_ran(seen, graded, FROM_OUTPUTS + FROM_METADATA + FROM_MARKDOWN)

    # the real formgrader (it reads HTMLExporter.sanitize_html from the course's config) on that notebook,
    # put in place of the graded one for this visit: the outputs' scripts are escaped, the markdown's and
    # the image width's are not
    stored, kept = graded["autograded"], graded["autograded"].with_suffix(".kept")
    os.replace(stored, kept)
    try:
        shutil.copyfile(graded["executed"], stored)
        assert_ran(visit(page, formgrader_url(graded)), graded, FROM_MARKDOWN + FROM_METADATA)
    finally:
        os.replace(kept, stored)


def test_formgrader_page_runs_nothing_writes_nothing(graded, chromium):
    before = course_digest(graded["course"])
    page = instructor_page(graded, chromium)
    seen = visit(page, formgrader_url(graded))
    assert_inert(seen, graded, before)
    assert "My notes on weight_bytes" in seen["text"], seen["text"][:2000]
    assert "<script>(function(){document.title='PWNED'" in seen["text"]  # the markdown cell, shown as text


def test_feedback_runs_nothing_writes_nothing(graded, chromium):
    before = course_digest(graded["course"])
    page = instructor_page(graded, chromium)
    seen = visit(page, serve(page, graded["server"], "feedback", graded["feedback"].read_text()))
    assert_inert(seen, graded, before)
    assert "My notes on weight_bytes" in seen["text"], seen["text"][:2000]
    assert "<script>(function(){document.title='PWNED'" in seen["text"]
