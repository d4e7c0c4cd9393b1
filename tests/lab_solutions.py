"""The reference answers of a lab, taken from its solution notebook, and the checks they go through.

    answers = solution_answers("01-collectives")      # {"ring_all_reduce": <function>, ...}
    for check, answer in checked_answers("01-collectives"): check(answer)

Only the notebook's solution cells run (after the imports that any of its
cells makes), in a namespace whose functions travel by value to the ranks,
as they do from a notebook.  The pairs (check, answer) are read from the
graded test cells: ``lab01.check_ring_allreduce(ring_all_reduce)``.
"""
from __future__ import annotations

import ast
import importlib
from pathlib import Path

import nbformat

REPO = Path(__file__).resolve().parents[1]


def _cells(lab: str):
    (path,) = sorted((REPO / "solutions" / lab).glob("*.ipynb"))
    nb = nbformat.read(path, as_version=4)
    return [c for c in nb.cells if c.cell_type == "code"]


def _imports(source: str) -> list[str]:
    """The cell's top-level import statements (its magic and shell lines left out)."""
    python = "\n".join(line for line in source.splitlines() if not line.lstrip().startswith(("%", "!")))
    try:
        tree = ast.parse(python)
    except SyntaxError:
        return []
    return [ast.unparse(node) for node in tree.body if isinstance(node, (ast.Import, ast.ImportFrom))]


def solution_answers(lab: str) -> dict:
    """{name: object} defined by the lab's solution cells."""
    cells = _cells(lab)
    namespace = {"__name__": f"parlab_solutions_{lab.replace('-', '_')}"}  # not importable: by value
    for line in dict.fromkeys(i for c in cells for i in _imports(c.source)):
        exec(line, namespace)
    before = set(namespace)
    for c in cells:
        if c.metadata.get("nbgrader", {}).get("solution"):
            exec(compile(c.source, f"<{lab} solution cell>", "exec"), namespace)
    return {k: v for k, v in namespace.items() if k not in before and not k.startswith("_")}


def checked_answers(lab: str) -> list[tuple[str, str]]:
    """[("lab01.check_ring_allreduce", "ring_all_reduce"), ...] from the graded test cells."""
    pairs = []
    for c in _cells(lab):
        if not c.metadata.get("nbgrader", {}).get("grade"):
            continue
        for node in ast.walk(ast.parse(c.source)):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr.startswith("check_") and isinstance(node.func.value, ast.Name)
                    and node.args and isinstance(node.args[0], ast.Name)):
                pair = (f"{node.func.value.id}.{node.func.attr}", node.args[0].id)
                if pair not in pairs:
                    pairs.append(pair)
    return pairs


def resolve_check(dotted: str):
    """"lab01.check_ring_allreduce" -> parlab.grading.lab01.check_ring_allreduce."""
    module, name = dotted.split(".")
    return getattr(importlib.import_module(f"parlab.grading.{module}"), name)


def one_rank_exercises(lab: str, with_hidden: bool = True) -> tuple[dict, list[str]]:
    """The lab's launched exercises re-declared at world size 1, with the solution answers.

    Returns ({Exercise at world size 1: {name: answer}}, [checks that could not be re-declared]).
    ``with_hidden=False`` keeps the visible cases only (cheaper).  A check can
    be re-run at another world size only when it carries its ``Exercise``
    (``check.exercise``, from ``parlab.grading.harness.checker``); checks
    written before that harness are listed as missing.  Cases that name a root
    other than 0 are left out: a single rank is the only root.
    """
    import dataclasses

    answers = solution_answers(lab)
    batch, missing = {}, []
    for dotted, name in checked_answers(lab):
        ex = getattr(resolve_check(dotted), "exercise", None)
        if ex is None:
            missing.append(dotted)
            continue
        if ex.solo:  # a plain function: no ranks involved
            continue
        cases = tuple(c for hidden in (False, True)[:1 + with_hidden] for _, cs in ex.sets(hidden) for c in cs
                      if getattr(c, "root", None) in (None, 0))
        batch[dataclasses.replace(ex, visible=((1, cases),), hidden=())] = {name: answers[name]}
    return batch, missing
