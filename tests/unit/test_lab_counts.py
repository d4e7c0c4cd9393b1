"""Every count of exercises and points is derived from the solution notebooks' nbgrader metadata.

What a lab's notebook grades is the nbgrader "Autograder tests" cells (``grade: true``) and
their ``points``.  Several places repeat those numbers by hand; this module holds each of them
to the notebooks, for every lab folder under ``solutions/`` (a new lab is covered as soon as
its folder exists):

- the README's labs table, "N (P points)" in its "graded exercises" column;
- each exercise heading's "(P points)", against the points of its test cells;
- an intro's "Graded: Exercises 1–K (P points)";
- the lab's grading module: the checks its test cells call are its ``EXERCISES``, no more, no fewer.

An exercise is a markdown heading "... Exercise <id> ..." together with the test cells after it,
up to the next heading of its level or above; a test cell under no such heading (lab 00 has
none) is an exercise of its own.  Lab 06's Exercise 1a has two test cells, so it grades 8
checks in 7 exercises.
"""
from __future__ import annotations

import ast
import importlib
import re
from dataclasses import dataclass, field
from pathlib import Path

import nbformat
import pytest

from nbgrader_harness import lab_names, source_notebook

pytestmark = [pytest.mark.unit, pytest.mark.timeout(60)]

README = Path(__file__).resolve().parents[2] / "README.md"
HEADING = re.compile(r"^(#+)\s+(.*)$")
EXERCISE = re.compile(r"\bExercise\s+(\w+)")
POINTS = re.compile(r"\((\d+) points?\)")
README_ROW = re.compile(r"^\|\s*`(\d\d-[\w-]+)`\s*\|.*\|\s*(\d+) \((\d+) points?\)\s*\|\s*$")
INTRO = re.compile(r"Graded: Exercises \d+\s*[–-]\s*(\d+) \((\d+) points?\)")


@dataclass
class Exercise:
    """One exercise of a notebook: its heading (or its test cell's id) and its test cells."""

    title: str
    stated: int | None = None          # the heading's "(P points)", if it states them
    cells: list = field(default_factory=list)  # (grade_id, points, source)

    @property
    def points(self) -> int:
        return sum(points for _, points, _ in self.cells)


def exercises(path) -> list[Exercise]:
    """The notebook's exercises, in order, read from its headings and its nbgrader test cells."""
    found: list[Exercise] = []
    open_: tuple[int, Exercise] | None = None  # (heading level, exercise) the next test cells join
    for cell in nbformat.read(path, as_version=4).cells:
        if cell.cell_type == "markdown":
            for line in cell.source.splitlines():
                heading = HEADING.match(line)
                if not heading:
                    continue
                level, text = len(heading.group(1)), heading.group(2)
                if open_ and level <= open_[0]:
                    open_ = None
                if EXERCISE.search(text):
                    stated = POINTS.search(text)
                    open_ = (level, Exercise(text.strip(), int(stated.group(1)) if stated else None))
                    found.append(open_[1])
            continue
        meta = cell.metadata.get("nbgrader", {})
        if not meta.get("grade"):
            continue
        graded = (meta.get("grade_id", "?"), int(meta.get("points", 0)), cell.source)
        if open_:
            open_[1].cells.append(graded)
        else:
            found.append(Exercise(graded[0], None, [graded]))
    return found


def totals(lab: str) -> tuple[int, int]:
    """(exercises, points) of a lab, from its solution notebook."""
    found = exercises(source_notebook(lab))
    return len(found), sum(ex.points for ex in found)


def readme_table() -> dict[str, tuple[int, int]]:
    """{lab: (exercises, points)} from the README's labs table (its "graded exercises" column)."""
    rows = {}
    for line in README.read_text().splitlines():
        row = README_ROW.match(line)
        if row:
            rows[row.group(1)] = (int(row.group(2)), int(row.group(3)))
    return rows


def corrected_row(lab: str) -> str:
    n, points = totals(lab)
    return f"{n} ({points} point{'s' if points != 1 else ''})"


def test_readme_lists_every_lab_with_its_exercises_and_points():
    table = readme_table()
    labs = lab_names()
    assert labs, "no lab folder under solutions/"
    wrong = {lab: (table.get(lab), corrected_row(lab)) for lab in labs if table.get(lab) != totals(lab)}
    assert not wrong, ("README.md's labs table disagrees with the solution notebooks; "
                       f"{{lab: (README, notebooks)}}: {wrong}")
    assert not set(table) - set(labs), f"README.md lists labs with no solutions/ folder: {set(table) - set(labs)}"


@pytest.mark.parametrize("lab", lab_names())
def test_exercise_headings_and_intro_state_the_points_the_cells_give(lab):
    found = exercises(source_notebook(lab))
    assert found and all(ex.cells for ex in found), \
        f"{lab}: an exercise heading with no graded test cell: {[ex.title for ex in found if not ex.cells]}"
    for ex in found:
        assert ex.stated is None or ex.stated == ex.points, \
            f"{lab}: '{ex.title}' states {ex.stated} points; its test cells give {ex.points}"
    intro = [m for cell in nbformat.read(source_notebook(lab), as_version=4).cells
             if cell.cell_type == "markdown" for m in INTRO.finditer(cell.source)]
    for m in intro:
        last = EXERCISE.search(found[-1].title)
        assert int(m.group(2)) == sum(ex.points for ex in found), \
            f"{lab}: the intro says {m.group(0)!r}; the test cells give {sum(ex.points for ex in found)} points"
        assert last and re.match(re.escape(m.group(1)) + r"[a-z]?$", last.group(1)), \
            f"{lab}: the intro says {m.group(0)!r}; the last exercise is {found[-1].title!r}"


def _checks_called(source: str) -> set[str]:
    """"check_*" attribute calls on ``labNN`` in a test cell: {"check_ring_allreduce", ...}."""
    return {node.func.attr for node in ast.walk(ast.parse(source))
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and node.func.attr.startswith("check_")}


@pytest.mark.parametrize("lab", lab_names())
def test_the_test_cells_check_exactly_the_labs_exercises(lab):
    module = importlib.import_module(f"parlab.grading.lab{lab[:2]}")
    called = {name for ex in exercises(source_notebook(lab)) for *_, source in ex.cells
              for name in _checks_called(source)}
    declared = {ex.key for ex in module.EXERCISES.values()}
    checked = {getattr(module, name).exercise.key for name in called}
    assert checked == declared, (f"{lab}: EXERCISES without a test cell: {sorted(declared - checked)}; "
                                 f"test cells checking no exercise of EXERCISES: {sorted(checked - declared)}")


def test_reader_groups_test_cells_under_their_heading(tmp_path):
    md, code = nbformat.v4.new_markdown_cell, nbformat.v4.new_code_cell

    def test_cell(grade_id, points):
        return code("lab99.check_x(x)", metadata={"nbgrader": {"grade": True, "grade_id": grade_id,
                                                                "points": points}})
    nb = nbformat.v4.new_notebook(cells=[
        md("# Lab\n## 1. Exercise 1a — two parts (3 points)"), test_cell("a", 1), test_cell("b", 2),
        md("## 2. Not an exercise"), test_cell("c", 4),
        md("### Exercise 2 — one (1 point)"), code("x = 1"), test_cell("d", 1)])
    path = tmp_path / "lab.ipynb"
    nbformat.write(nb, path)
    found = exercises(path)
    assert [(ex.title, ex.stated, ex.points) for ex in found] == [
        ("1. Exercise 1a — two parts (3 points)", 3, 3), ("c", None, 4), ("Exercise 2 — one (1 point)", 1, 1)]
