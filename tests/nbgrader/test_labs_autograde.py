"""Every lab through the real nbgrader: the solution gets full marks, the blank release gets 0.

The solution notebook runs whole.  The blank is the release cut down to its
graded cells (``graded_cells_only``): nbgrader scores only those, and each
of its test cells must fail because its answer is missing, not because a
demonstration cell was cut.

One generation process makes every selected lab, and ``STREAMS`` autograde
processes, one per usable core, grade both students of each lab side by side
(``nbgrader_harness.autograde_labs``; each nbgrader command costs several
seconds of start-up, and one stream leaves cores idle while its launches
start).  Afterwards no process that the run started (kernels, torchrun,
ranks) may still be alive.  Timings are printed (run pytest with -s to see
them) and also reported on failure.
"""
import re
import time

import nbformat
import pytest

from nbgrader_harness import RELEASED_GRADED_CELLS, autograde_labs, lab_names, leftover_processes, source_notebook
from parlab.cores import usable_cores

pytestmark = [pytest.mark.nbgrader, pytest.mark.timeout(2700)]  # the first test waits for every lab

#: A blank lab must fail fast: no cell may get near nbgrader's cell timeout.
BLANK_SECONDS = 240
#: Autograde processes at once: one per core the tests may use.
STREAMS = usable_cores()


@pytest.fixture(scope="module")
def course(request, tmp_path_factory):
    """Every selected lab generated and autograded in one go: {lab: result}.

    The blank is the student version generated in the same run (whether the
    committed labs/ matches it is tests/nbgrader/test_labs_release.py's business).
    Only the labs whose tests were selected (``-k 06``) are graded.
    """
    here = request.node.path
    labs = sorted({item.callspec.params["graded"] for item in request.session.items
                   if item.path == here and hasattr(item, "callspec")})
    results = autograde_labs(labs, {"solution": {lab: source_notebook(lab) for lab in labs},
                                    "blank": RELEASED_GRADED_CELLS},
                             workdir=tmp_path_factory.mktemp("course"), streams=STREAMS)
    for lab, result in results.items():
        run = result["_run"]
        print(f"\n[{lab}] notebooks: solution {result['solution']['seconds']:.1f} s, "
              f"blank {result['blank']['seconds']:.1f} s")
    print(f"\n[{len(labs)} labs] generate {run['generate_seconds']:.1f} s, autograde (2 students each, "
          f"{run['streams']} at once) {run['autograde_seconds']:.1f} s")
    return results


@pytest.fixture(params=lab_names())
def graded(request, course):
    return request.param, course[request.param]


def cell_errors(path) -> dict:
    """{grade_id or cell id: "ename: evalue"} for each cell of a notebook that ended in an error."""
    errors = {}
    for cell in nbformat.read(path, as_version=4).cells:
        for out in cell.get("outputs", []):
            if out.get("output_type") == "error":
                grade_id = cell.metadata.get("nbgrader", {}).get("grade_id", cell.get("id"))
                errors[grade_id] = f"{out['ename']}: {out['evalue']}"
    return errors


def failed_outputs(path) -> str:
    """Error outputs of an autograded notebook, to explain a lost point."""
    return "\n".join(f"{k}: {v[:300]}" for k, v in cell_errors(path).items())


def test_solution_gets_full_marks(graded):
    lab, result = graded
    sol = result["solution"]
    assert sol["max_score"] > 0, f"{lab} has no graded cells"
    lost = {k: v for k, v in sol["cells"].items() if v[0] != v[1]}
    assert not lost, f"{lab}: the solution lost points in {lost}\n{failed_outputs(sol['autograded'])}"
    assert sol["score"] == sol["max_score"]


def test_blank_release_scores_zero_in_time(graded):
    lab, result = graded
    blank = result["blank"]
    scored = {k: v for k, v in blank["cells"].items() if v[0] != 0}
    assert not scored, f"{lab}: the untouched release notebook earned points in {scored}"
    assert blank["max_score"] == result["solution"]["max_score"]
    assert blank["seconds"] < BLANK_SECONDS, f"{lab}: the blank notebook took {blank['seconds']:.0f} s"
    errors = cell_errors(blank["autograded"])
    assert set(blank["cells"]) <= set(errors), f"{lab}: blank test cells that did not fail: " \
        f"{set(blank['cells']) - set(errors)}"
    for grade_id in blank["cells"]:  # each fails on its stub (raise NotImplementedError), nothing else
        assert on_the_stub(errors[grade_id], blank["autograded"], errors), \
            f"{lab}: blank test cell {grade_id} failed for another reason than the missing answer: " \
            f"{errors[grade_id][:600]}"


def on_the_stub(error: str, path, errors: dict, seen: frozenset = frozenset()) -> bool:
    """Whether a test cell's error comes from the release's stubs, ``raise NotImplementedError()``.

    Either the check ran a stub, or the answer could not be handed in because
    a stub stopped the cell that defines it: a class body that raises, or a
    class built on another answer whose own cell stopped that way.
    """
    if "NotImplementedError" in error:
        return True
    missing = re.search(r"(\w+) could not be handed in|name '(\w+)' is not defined", error)
    if not missing:
        return False
    name = missing.group(1) or missing.group(2)
    if name in seen:
        return False
    for cell in nbformat.read(path, as_version=4).cells:
        grade_id = cell.metadata.get("nbgrader", {}).get("grade_id", cell.get("id"))
        if cell.cell_type == "code" and re.search(rf"^(class|def) {name}\b", cell.source, re.M):
            return grade_id in errors and on_the_stub(errors[grade_id], path, errors, seen | {name})
    return False


def test_no_process_left_behind(graded):
    lab, result = graded
    deadline = time.monotonic() + 10  # the launcher ends its ranks within about a second
    while (left := leftover_processes(result["_run"]["token"])) and time.monotonic() < deadline:
        time.sleep(0.25)
    assert not left, f"{lab}: processes started by autograde are still alive: {left}"
