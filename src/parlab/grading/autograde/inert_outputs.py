"""The autograded notebook made inert: nothing a submission wrote can run where it is shown.

nbgrader's feedback HTML and the formgrader's page of a submission are both
made from the autograded notebook, and the formgrader's page is served by the
instructor's own Jupyter server: a script there runs with the instructor's
session (the ``_xsrf`` cookie is readable) and can write the course through
the contents API.  ``HTMLExporter.sanitize_html = True`` (``nbgrader_config.py``)
escapes scripts in cell outputs when those pages are rendered, but nbgrader's
``feedback`` and ``formgrade`` templates render markdown cells themselves,
without it; and the stored notebook would stay live for any other viewer.

``InertOutputs``, in the autograde pipeline right after the execute step,
changes the notebook itself:

- **Outputs.**  Every ``display_data`` and ``execute_result`` keeps only
  ``text/plain``, PNG and JPEG.  ``text/html``, ``application/javascript``,
  ``image/svg+xml``, markdown, LaTeX, widgets and any other type are
  dropped; an output left without ``text/plain`` gets the dropped
  content's source as its ``text/plain``.  This applies to every code cell,
  locked ones included: every such output came from the student's kernel,
  whose state the student's cells control (``IPython.display`` or a display
  formatter replaced in an earlier cell shows up in any later cell).  The
  grader's own outputs (the sandbox's verdicts, parlab's notes, errors) are
  ``stream`` and ``error`` outputs, which are rendered as escaped text and
  left as they are.
- **Markdown.**  Each markdown cell is rendered as the pages render it
  (nbconvert's ``markdown2html``) and the HTML is read with an allowlist:
  known inert tags (paragraphs, headings, lists, tables, code, links,
  images, ...), inert attributes, and links and images only to ``http``,
  ``https``, ``mailto``, relative addresses, or PNG/JPEG/GIF/WebP data.  A
  cell with anything else (``<script>``, ``onerror=``, ``<iframe>``,
  ``<svg>``, a ``javascript:`` link, an HTML comment, markup the parser could
  not read) is replaced by a note and its whole source in a fenced code
  block, which renders as escaped text.  This depends on what the cell
  holds, not on its nbgrader metadata (which a student can edit): the
  course's own markdown passes the allowlist and is left as it is
  (``tests/unit/test_inert_outputs.py`` reads every lab's).
"""
from __future__ import annotations

import json
import re
from html.parser import HTMLParser

from nbgrader.preprocessors import NbGraderPreprocessor

#: What a display output keeps: plain text and raster images (rendered as escaped text and as <img> data).
KEPT_TYPES = ("text/plain", "image/png", "image/jpeg")
#: Which dropped type becomes the text/plain of an output that has none (the most readable source first).
_AS_TEXT = ("text/markdown", "text/latex", "text/html", "image/svg+xml", "application/javascript")

#: Tags that do nothing by themselves: what nbconvert's markdown renders, and plain formatting.
INERT_TAGS = frozenset("""
    a abbr b blockquote br caption cite code col colgroup dd del details div dl dt em figcaption figure
    h1 h2 h3 h4 h5 h6 hr i img input ins kbd li mark ol p pre q s samp small span strike strong sub summary
    sup table tbody td tfoot th thead tr tt u ul var
""".split())
#: Attributes that do nothing by themselves (URL and style values are checked on their own).
INERT_ATTRIBUTES = frozenset("""
    align alt checked cite class colspan dir disabled height href id lang open rowspan scope src start
    style title type valign width
""".split())
_URL_ATTRIBUTES = ("href", "src", "cite")
_SAFE_SCHEMES = ("http", "https", "mailto")
_IMAGE_DATA = re.compile(r"data:image/(png|jpeg|gif|webp)[;,]", re.IGNORECASE)
_SCHEME = re.compile(r"([a-zA-Z][a-zA-Z0-9+.\-]*):")
_TABLE_ALIGN = re.compile(r"\s*text-align\s*:\s*(left|right|center)\s*;?\s*", re.IGNORECASE)
# Dropped from a URL before its scheme is read: browsers drop tabs and newlines anywhere and other controls
# and spaces at its ends; dropping them anywhere is stricter.
_URL_IGNORED = re.compile(r"[\x00-\x20]")


def _attribute_problem(tag: str, name: str, value: str | None) -> str | None:
    if name not in INERT_ATTRIBUTES:
        return f"the attribute {name}= on <{tag}>"
    value = value or ""
    if name == "style" and not _TABLE_ALIGN.fullmatch(value):
        return f"a style on <{tag}>"
    if name == "type" and tag == "input" and value.lower() != "checkbox":
        return f'<input type="{value}">'
    if name in _URL_ATTRIBUTES:
        url = _URL_IGNORED.sub("", value)
        scheme = _SCHEME.match(url)
        if scheme and scheme.group(1).lower() not in _SAFE_SCHEMES \
                and not (tag == "img" and name == "src" and _IMAGE_DATA.match(url)):
            return f"a {scheme.group(1).lower()}: address in {name}= on <{tag}>"
    return None


class _Reader(HTMLParser):
    """Collects what in a piece of HTML is not on the allowlist."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=False)  # so that a raw "<" in text is seen as such
        self.found: list[str] = []

    def handle_starttag(self, tag, attrs):
        if tag not in INERT_TAGS:
            self.found.append(f"<{tag}>")
        for name, value in attrs:
            problem = _attribute_problem(tag, name, value)
            if problem:
                self.found.append(problem)

    handle_startendtag = handle_starttag

    def handle_endtag(self, tag):
        if tag not in INERT_TAGS:
            self.found.append(f"</{tag}>")

    def handle_data(self, data):
        # The renderer escapes every "<" of text; one left raw is markup this parser did not read
        # as a tag (a browser may).
        if "<" in data:
            self.found.append("markup that is not a well-formed tag")

    def handle_comment(self, data):
        self.found.append("an HTML comment")

    def handle_decl(self, decl):
        self.found.append("an HTML declaration")

    def unknown_decl(self, data):
        self.found.append("an HTML declaration")

    def handle_pi(self, data):
        self.found.append("an HTML processing instruction")


def active_html(html: str) -> list[str]:
    """What in ``html`` is not known to be inert (empty when all of it is), in the order found."""
    reader = _Reader()
    reader.feed(html)
    reader.close()
    return list(dict.fromkeys(reader.found))


def _is_base64(value) -> bool:
    import base64
    import binascii

    text = "".join(value) if isinstance(value, list) else value
    if not isinstance(text, str):
        return False
    try:
        base64.b64decode("".join(text.split()), validate=True)
        return True
    except (binascii.Error, ValueError):
        return False


def _inert_metadata(output) -> None:
    """Rebuild a kept output's metadata: only an image's ``width``/``height``, as whole numbers.

    nbconvert's templates write an image's width and height into its tag
    unquoted (``width={{ width | escape_html }}``): a string there, such as
    ``1 onerror=...``, is an attribute of the student's.  Everything else in the
    metadata is dropped.
    """
    metadata, kept = output.get("metadata", {}), {}
    for kind in ("image/png", "image/jpeg"):
        size = metadata.get(kind)
        if kind in output.get("data", {}) and isinstance(size, dict):
            whole = {k: int(v) for k, v in size.items()
                     if k in ("width", "height") and type(v) in (int, float) and 0 < v < 1e5}
            if whole:
                kept[kind] = whole
    output["metadata"] = kept


def inert_bundle(output) -> list[str]:
    """Drop every type but ``KEPT_TYPES`` from a display output, in place; the types dropped.

    An image whose data is not base64 (the pages put it in a ``src="data:..."``
    attribute) is dropped too, and the metadata of what is kept is rebuilt
    (``_inert_metadata``).
    """
    data = output.get("data", {})
    dropped = [kind for kind in data if kind not in KEPT_TYPES
               or kind.startswith("image/") and not _is_base64(data[kind])]
    if not dropped:
        _inert_metadata(output)
        return []
    if "text/plain" not in data:
        kind = next((k for k in _AS_TEXT if k in data), dropped[0])
        value = data[kind]
        data["text/plain"] = value if isinstance(value, str) else json.dumps(value, indent=1)
    for kind in dropped:
        del data[kind]
    _inert_metadata(output)  # "filenames" too: image paths of an extract step are not the student's to name
    return dropped


#: The note above a markdown cell shown as text (what it held is in the grader's log: tag names are the student's).
FENCED_NOTE = "*parlab: this cell held HTML that could run in a browser; its text is shown as written.*"


def fenced(source: str) -> str:
    """Markdown that shows ``source`` verbatim as a code block, after ``FENCED_NOTE``."""
    longest = max((len(run) for run in re.findall(r"`+", source)), default=0)
    fence = "`" * max(3, longest + 1)  # no line of the source can close it
    return f"{FENCED_NOTE}\n\n{fence}\n{source}\n{fence}\n"


class InertOutputs(NbGraderPreprocessor):
    """Make a graded notebook's outputs and markdown inert (see the module's docstring)."""

    def preprocess(self, nb, resources):
        from nbconvert.exporters import HTMLExporter

        # markdown is read as the feedback and the formgrader render it: their exporter's settings
        self._exporter = HTMLExporter(config=self.config)
        return super().preprocess(nb, resources)

    def preprocess_cell(self, cell, resources, index):
        if cell.cell_type == "code":
            # the templates write execution counts into the page unescaped: whole numbers only
            if not (cell.get("execution_count") is None or type(cell.get("execution_count")) is int):
                cell["execution_count"] = None
            for output in cell.get("outputs", []):
                if "execution_count" in output and not (output["execution_count"] is None
                                                        or type(output["execution_count"]) is int):
                    output["execution_count"] = None
                if output.get("output_type") in ("display_data", "execute_result"):
                    dropped = inert_bundle(output)
                    if dropped:
                        self.log.info("parlab: cell %d: %s shown as plain text", index, ", ".join(dropped))
        elif cell.cell_type == "markdown":
            why = self._markdown_problems(cell, resources)
            if why:
                self.log.warning("parlab: markdown cell %d holds %r: shown as text", index, why)  # %r: the student's text
                cell.source = fenced(cell.source)
                cell.pop("attachments", None)
                if active_html(self._render(cell, resources)):  # cannot happen: a code block is escaped
                    raise RuntimeError(f"parlab: markdown cell {index} is still not inert after fencing")
        return cell, resources

    def _render(self, cell, resources) -> str:
        return self._exporter.markdown2html({"cell": cell, "resources": resources}, cell.source)

    def _markdown_problems(self, cell, resources) -> list[str]:
        try:
            html = self._render(cell, resources)
        except Exception as exc:  # noqa: BLE001 - e.g. a missing attachment: the pages could not render it either
            return [f"markdown that cannot be rendered ({type(exc).__name__})"]
        return active_html(html)
