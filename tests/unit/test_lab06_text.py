"""Lab 06's prose quotes the planner's numbers: they must be the numbers the notebook prints.

The markdown after the scenario cell and after the published-layouts cell repeats figures that
the cells above it print (step times, memory, tokens/s, ratios). This test runs those cells of
the solution notebook (planner arithmetic only, no ranks) and checks that every decimal or
thousands-grouped number in that prose appears in what they printed, so that a change to the
planner's constants cannot leave the text stale.
"""
import contextlib
import io
import json
import re
from pathlib import Path

import pytest

pytestmark = [pytest.mark.unit, pytest.mark.timeout(120)]

NOTEBOOK = Path(__file__).resolve().parents[2] / "solutions" / "06-3d-parallel" / "06-3d-parallel.ipynb"
# Numbers the prose cites from outside the notebook (with their source in the prose itself).
CITED = {"6.4", "2,048", "5,762", "3.1",
         "8,192",  # NeMo's and torchtitan's Llama 3 70B sequence length, from their recipe files
         "1.3", "54.2", "42.1", "2,240", "2205.05198"}  # Korthikanti et al. 2022's measured gain
NUMBER = re.compile(r"(?<![\w.])\d{1,3}(?:,\d{3})+(?![\d,])|(?<![\w.])\d+\.\d+(?!\d)")


def _cells():
    return json.loads(NOTEBOOK.read_text())["cells"]


def _source(cell):
    return "".join(cell["source"])


def _printed_and_prose():
    cells = _cells()
    start = next(i for i, c in enumerate(cells) if _source(c).startswith("## 5."))
    namespace, out, prose = {}, io.StringIO(), []
    with contextlib.redirect_stdout(out):
        exec(_source(cells[1]), namespace)  # the imports
        for cell in cells[start:]:
            src = _source(cell)
            if cell["cell_type"] == "markdown":
                if src.startswith(("Each difference", "Both published")):
                    prose.append(src)
                continue
            if "parlab.launch" in src or "lab06.check" in src or "calculator" in src:
                continue
            exec(src, namespace)
    return out.getvalue(), prose


def test_prose_numbers_are_printed_by_the_notebook():
    printed, prose = _printed_and_prose()
    assert prose, "the planner's explanation cells were not found"
    missing = []
    for text in prose:
        for number in NUMBER.findall(text):
            if number not in CITED and number not in printed:
                missing.append(number)
    assert not missing, f"lab 06 states numbers its cells do not print: {missing}"


def test_prose_counts_the_published_runs_it_refers_to():
    from parlab import planner_published

    _, prose = _printed_and_prose()
    words = {9: "nine", 10: "ten", 11: "eleven", 12: "twelve"}
    assert f"`docs/planner.md` gives all {words[len(planner_published.RUNS)]} runs" in "\n".join(prose)
