"""A notebook states every rule its checks enforce, and the checks enforce every rule it states.

Each exercise's markdown lists its rules under a line ``**Rules (checked):**``
as bullets.  Those bullets must be exactly the ``Rule.says`` sentences that
the lab's grading module declares (``parlab.grading.labNN``), no more, no
fewer.  Every declared rule must also be broken by at least one fixture in
tests/wrong_answers/ (checked by each lab's own tests through the message
words; here only the statement side is checked).
"""
from __future__ import annotations

import importlib
import re

import nbformat
import pytest

from nbgrader_harness import lab_names, release_notebook, source_notebook

pytestmark = [pytest.mark.unit, pytest.mark.timeout(60)]

HEADING = "**Rules (checked):**"


def stated_rules(path) -> list[str]:
    """Every bullet under a ``**Rules (checked):**`` line of the notebook's markdown cells."""
    rules = []
    for cell in nbformat.read(path, as_version=4).cells:
        if cell.cell_type != "markdown" or HEADING not in cell.source:
            continue
        for block in cell.source.split(HEADING)[1:]:
            for line in block.lstrip("\n").splitlines():
                bullet = re.match(r"\s*[-*]\s+(.*)", line)
                if not bullet:
                    break
                rules.append(bullet.group(1).strip())
    return rules


def declared_rules(lab: str) -> list[str]:
    """Every Rule.says of the lab's exercises (those its check_* functions grade)."""
    module = importlib.import_module(f"parlab.grading.lab{lab[:2]}")
    exercises = {fn.exercise.key: fn.exercise for name, fn in vars(module).items()
                 if name.startswith("check_") and hasattr(fn, "exercise")}
    return [rule.says for ex in exercises.values() for rule in ex.rules]


@pytest.mark.parametrize("lab", lab_names())
def test_notebook_states_exactly_the_rules_its_checks_enforce(lab):
    stated, declared = stated_rules(source_notebook(lab)), declared_rules(lab)
    missing = [r for r in declared if r not in stated]
    unenforced = [r for r in stated if r not in declared]
    assert not missing, f"{lab}: enforced but not stated in the notebook: {missing}"
    assert not unenforced, f"{lab}: stated in the notebook but not enforced: {unenforced}"


@pytest.mark.parametrize("lab", lab_names())
def test_release_states_the_same_rules(lab):
    assert stated_rules(release_notebook(lab)) == stated_rules(source_notebook(lab))


def test_reader_finds_bullets_only_under_the_heading(tmp_path):
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell(
        "Intro\n- not a rule\n\n**Rules (checked):**\n- Rule one.\n* Rule two.\n\nAfter.\n- not a rule")])
    path = tmp_path / "rules.ipynb"
    nbformat.write(nb, path)
    assert stated_rules(path) == ["Rule one.", "Rule two."]
