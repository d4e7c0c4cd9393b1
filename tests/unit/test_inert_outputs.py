"""``InertOutputs``: what it keeps, what it shows as text, and that the course's own notebooks pass it unchanged.

Chromium opening the feedback and the formgrader's page of a hostile
submission is tests/browser/test_browser_inert_feedback.py.
"""
from __future__ import annotations

import copy
from pathlib import Path

import nbformat
import pytest
from nbconvert.exporters import HTMLExporter
from traitlets.config.loader import PyFileConfigLoader

from parlab.grading.autograde import GuardedExecute, InertOutputs
from parlab.grading.autograde.inert_outputs import FENCED_NOTE, active_html, fenced, inert_bundle

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]


def rendered(source: str) -> str:
    """Markdown as nbgrader's feedback and formgrade templates render it (nbconvert's markdown2html)."""
    return HTMLExporter().markdown2html({}, source)


def test_course_config_runs_it_after_the_execute_step_and_sanitizes_its_pages():
    config = PyFileConfigLoader("nbgrader_config.py", path=str(REPO)).load_config()
    steps = config.Autograde.autograde_preprocessors
    assert steps[steps.index(GuardedExecute) + 1] is InertOutputs
    assert config.HTMLExporter.sanitize_html is True


@pytest.mark.parametrize("path", sorted(REPO.glob("solutions/*/*.ipynb")) + sorted(REPO.glob("labs/*/*.ipynb")),
                         ids=lambda p: f"{p.parts[-3]}/{p.name}")
def test_every_lab_markdown_cell_is_left_as_it_is(path):
    nb = nbformat.read(path, as_version=4)
    before = copy.deepcopy(nb)
    InertOutputs().preprocess(nb, {})
    assert [c.source for c in nb.cells] == [c.source for c in before.cells]


@pytest.mark.parametrize("source", [
    "<script>alert(1)</script>",
    'text <img src="x" onerror="alert(1)"> text',
    "<div\nonclick=alert(1)>x</div>",
    "[link](javascript:alert(1))",
    "[link](<javascript:alert(1)>)",
    '<a href="&#106;avascript:alert(1)">entity-encoded</a>',
    '<a href="java\tscript:alert(1)">a tab in the scheme</a>',
    "<!--><img src=x onerror=alert(1)>-->",
    "<svg><script>alert(1)</script></svg>",
    '<iframe srcdoc="&lt;script&gt;alert(1)&lt;/script&gt;"></iframe>',
    "<style>body { display: none }</style>",
    '<p style="position: fixed; top: 0">an overlay</p>',
    "![an svg](data:image/svg+xml;base64,PHN2Zz48L3N2Zz4=)",
    '<object data="x.swf"></object>',
    '<input type="image" src="x">',
    "```mermaid\n<script>alert(1)</script>\n```",  # nbconvert puts a mermaid block's source in unescaped
])
def test_markup_that_could_run_is_found(source):
    assert active_html(rendered(source)), rendered(source)


@pytest.mark.parametrize("source", [
    "plain *text*, `a < b && c`, $x < y$ and $$a<b$$",
    "# A heading\n\n> a quote\n\n- [x] done\n- [ ] not yet\n\n1. one\n\nterm\n: its definition",
    "| left | right |\n|:--|--:|\n| 1 | 2 |",
    "```python\nif a < b:\n    print('<b>')\n```",
    "[a link](https://example.org/x?a=1&b=2 'a title'), <https://example.org>, [mail](mailto:x@example.org)",
    "![a figure](figures/x.png) ![inline](data:image/png;base64,iVBORw0KGgo=)",
    "<details><summary>more</summary>\n\n<b>bold</b>, <sub>1</sub>, <br>, <kbd>Ctrl</kbd>\n\n</details>",
])
def test_inert_markdown_is_left_alone(source):
    assert active_html(rendered(source)) == []


def test_a_fenced_cell_shows_its_source_and_runs_nothing():
    source = "````\n<script>alert(1)</script>\n$$<img src=x onerror=alert(2)>$$\n```"
    shown = fenced(source)
    assert shown.startswith(FENCED_NOTE) and source in shown
    html = rendered(shown)
    assert active_html(html) == []
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html  # the whole source, as text


def test_display_outputs_keep_plain_text_and_raster_images():
    html = {"output_type": "display_data", "metadata": {"text/html": {"isolated": True}},
            "data": {"text/html": "<script>x()</script>", "text/plain": "<HTML object>"}}
    assert inert_bundle(html) == ["text/html"]
    assert html == {"output_type": "display_data", "metadata": {}, "data": {"text/plain": "<HTML object>"}}

    js = {"output_type": "display_data", "metadata": {}, "data": {"application/javascript": "x()"}}
    assert inert_bundle(js) == ["application/javascript"] and js["data"] == {"text/plain": "x()"}

    widget = {"output_type": "execute_result", "metadata": {}, "execution_count": 1,
              "data": {"application/vnd.jupyter.widget-view+json": {"model_id": "m"}}}
    inert_bundle(widget)
    assert list(widget["data"]) == ["text/plain"] and '"model_id": "m"' in widget["data"]["text/plain"]

    figure = {"output_type": "display_data", "metadata": {"image/png": {"width": 10}, "filenames": {"image/png": "x"}},
              "data": {"image/png": "iVBORw0KGgo=", "image/svg+xml": "<svg onload='x()'/>", "text/plain": "fig"}}
    assert inert_bundle(figure) == ["image/svg+xml"]
    assert figure["data"] == {"image/png": "iVBORw0KGgo=", "text/plain": "fig"}
    assert figure["metadata"] == {"image/png": {"width": 10}}

    plain = {"output_type": "display_data", "metadata": {}, "data": {"text/plain": "1", "image/jpeg": "/9j/"}}
    assert inert_bundle(plain) == [] and plain["data"] == {"text/plain": "1", "image/jpeg": "/9j/"}

    # the templates write an image's width and height unquoted into its tag: only whole numbers stay
    sized = {"output_type": "display_data", "data": {"image/png": "iVBORw0KGgo="},
             "metadata": {"image/png": {"width": "1 onerror=alert(1)", "height": 20.0, "x": "y"}, "other": "z"}}
    assert inert_bundle(sized) == [] and sized["metadata"] == {"image/png": {"height": 20}}
    # and data that is not base64 would close the src="data:..." attribute
    forged = {"output_type": "display_data", "metadata": {},
              "data": {"image/png": '" onerror="alert(1)', "text/plain": "img"}}
    assert inert_bundle(forged) == ["image/png"] and forged["data"] == {"text/plain": "img"}


def test_every_code_cell_and_the_students_markdown_are_made_inert():
    """A locked test cell's display is the kernel's too (an earlier cell can replace ``display``); the
    grader's own outputs (stream, error) are left as they are."""
    answer = nbformat.v4.new_code_cell("display(HTML(...))", metadata={"nbgrader": {"solution": True}})
    answer.outputs = [nbformat.v4.new_output("display_data", data={"text/html": "<script>a()</script>",
                                                                   "text/plain": "answer"})]
    test = nbformat.v4.new_code_cell("lab00.check_x(x)", metadata={"nbgrader": {"grade": True, "locked": True}})
    test.outputs = [nbformat.v4.new_output("execute_result", data={"text/markdown": "<script>b()</script>"}),
                    nbformat.v4.new_output("stream", name="stdout", text="<script>c()</script>"),
                    nbformat.v4.new_output("error", ename="AssertionError", evalue="<b>", traceback=["<b>"])]
    notes = nbformat.v4.new_markdown_cell("mine <img src=x onerror=d()>")
    course = nbformat.v4.new_markdown_cell("## Exercise 1\n\nWrite `hello()`.")
    nb = nbformat.v4.new_notebook(cells=[course, answer, test, notes])
    grader_outputs = copy.deepcopy(test.outputs[1:])

    InertOutputs().preprocess(nb, {})

    assert answer.outputs[0]["data"] == {"text/plain": "answer"}
    assert test.outputs[0]["data"] == {"text/plain": "<script>b()</script>"}
    assert test.outputs[1:] == grader_outputs
    assert notes.source == fenced("mine <img src=x onerror=d()>")
    assert course.source == "## Exercise 1\n\nWrite `hello()`."
