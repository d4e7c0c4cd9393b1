"""Autograding that a submission cannot subvert, and that never punishes a correct answer.

One adversarial lab 01 submission, autograded by the real nbgrader with the
course's config (parlab's GuardedExecute), does four things at once:

- a cell kills the kernel (``os._exit``) early on: only that cell is lost,
  the kernel is restarted, and the rest of the notebook is still graded;
- Exercise 1's correct answer prints hundreds of lines and warns on every
  rank: it keeps full marks (nothing parlab writes may reach stderr);
- Exercise 2's answer is wrong, and a cell then replaces the check, the
  harness, ``parlab.launch``, ``torch.equal`` and ``builtins.AssertionError``
  in the kernel: it still scores 0;
- the other exercises are untouched solutions and keep full marks.
"""
from __future__ import annotations

import time

import nbformat
import pytest

from nbgrader_harness import autograde, graded_cells_only, leftover_processes, source_notebook

pytestmark = [pytest.mark.nbgrader, pytest.mark.timeout(900)]

KILLER = "import os\nos._exit(1)  # the kernel dies here"

CHATTY = '''import warnings
_quiet_rs_ag = all_reduce_rs_ag

def all_reduce_rs_ag(x):
    for i in range(600):
        print("a chatty but correct answer, line", i)
    warnings.warn("a warning raised on a rank")
    return _quiet_rs_ag(x)
'''

HOSTILE = '''def ring_all_reduce(x):
    return x.clone()  # wrong: no communication at all

import builtins, torch, parlab
from parlab.grading import harness, lab01
lab01.check_ring_allreduce = lambda *args, **kwargs: print("all tests passed")
harness.grade_batch = lambda *args, **kwargs: {}
parlab.launch = lambda *args, **kwargs: []
torch.equal = lambda *args, **kwargs: True
builtins.AssertionError = type("NotAnError", (Exception,), {})
'''


def _after_solution_of(nb, name: str) -> int:
    """Index just after the solution cell that defines ``name``."""
    for i, cell in enumerate(nb.cells):
        if cell.cell_type == "code" and f"def {name}(" in cell.source:
            return i + 1
    raise AssertionError(f"no cell defines {name}")


def adversary(path) -> None:
    nb = nbformat.read(source_notebook("01-collectives"), as_version=4)
    graded_cells_only(nb)
    nb.cells.insert(_after_solution_of(nb, "ring_all_reduce"), nbformat.v4.new_code_cell(HOSTILE))
    nb.cells.insert(_after_solution_of(nb, "all_reduce_rs_ag"), nbformat.v4.new_code_cell(CHATTY))
    first_code = next(i for i, c in enumerate(nb.cells) if c.cell_type == "code")
    nb.cells.insert(first_code + 1, nbformat.v4.new_code_cell(KILLER))
    nbformat.write(nb, path)


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    root = tmp_path_factory.mktemp("guard")
    adversary(root / "adversary.ipynb")
    return autograde("01-collectives", {"adversary": root / "adversary.ipynb"},
                     workdir=root / "course")


#: nbgrader clears cell metadata in the autograded copy, so find test cells by their call.
CALLS = {"test_ex1_rs_ag": "lab01.check_allreduce_from_rs_ag(", "test_ex2_ring": "lab01.check_ring_allreduce("}


def _cell(result, grade_id):
    for cell in nbformat.read(result["adversary"]["autograded"], as_version=4).cells:
        if cell.cell_type == "code" and cell.source.lstrip().startswith("from parlab.grading import lab01") \
                and CALLS[grade_id] in cell.source:
            return cell
    raise AssertionError(f"no test cell {grade_id} in the autograded notebook")


def test_hostile_wrong_answer_scores_zero(graded):
    assert graded["adversary"]["cells"]["test_ex2_ring"][0] == 0
    errors = [o for o in _cell(graded, "test_ex2_ring").outputs if o.output_type == "error"]
    assert errors and "ring_all_reduce" in errors[0].evalue, errors


def test_chatty_correct_answer_keeps_full_marks(graded):
    score, points = graded["adversary"]["cells"]["test_ex1_rs_ag"]
    outputs = _cell(graded, "test_ex1_rs_ag").outputs
    assert score == points, outputs
    assert not [o for o in outputs if o.output_type == "error" or o.get("name") == "stderr"]


def test_kernel_death_costs_only_that_cell(graded):
    cells = graded["adversary"]["cells"]
    assert cells["test_ex3_tree"][0] == cells["test_ex3_tree"][1]
    assert cells["test_ex4_bw"][0] == cells["test_ex4_bw"][1]
    killed = [c for c in nbformat.read(graded["adversary"]["autograded"], as_version=4).cells
              if c.cell_type == "code" and c.source == KILLER]
    assert killed and any(o.get("ename") == "KernelDied" for o in killed[0].outputs)


def test_nothing_left_running(graded):
    deadline = time.monotonic() + 10  # the launcher ends its ranks within about a second
    while (left := leftover_processes(graded["_run"]["token"])) and time.monotonic() < deadline:
        time.sleep(0.25)
    assert not left, left
