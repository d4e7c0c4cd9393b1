"""Grading sandbox: shared launches vs one launch per check call, on a lab's solution answers.

The lab's solution answers are handed in as ``nbgrader autograde`` hands
them in (pickled by value, one request for every test cell of the
notebook), then graded twice in this run, side by side:

- shared: ``sandbox.shared_verdicts`` (calls that need the same world size
  share a launch), then ``grade_cell`` for whatever sharing left undecided;
- alone: ``grade_cell`` with no shared verdicts, one launch per call and
  world size, as the sandbox graded before.

It prints each way's wall time and launch count, their ratio, and whether
every verdict agrees (it must).

    OMP_NUM_THREADS=1 python benchmarks/sandbox_grading.py [LAB ...]   # default: 00-setup 03-tensor-parallel
"""
import argparse
import contextlib
import io
import sys
import tempfile
import time
from pathlib import Path

import cloudpickle
import nbformat

from parlab.grading import harness
from parlab.grading.autograde import sandbox, shared_launches
from parlab.grading.autograde import graded_calls

REPO = Path(__file__).resolve().parents[1]


def solution_answers(notebook: Path) -> dict:
    """The names the solution's answer cells define, as a student's kernel would hold them."""
    ns: dict = {"__name__": "__parlab_answers__"}  # not importable: cloudpickle sends it by value
    code = [c for c in nbformat.read(notebook, as_version=4).cells if c.cell_type == "code"]
    for i, cell in enumerate(code):  # the imports cell first, then every answer cell
        if i == 0 or cell.metadata.get("nbgrader", {}).get("solution"):
            source = "\n".join(x for x in cell.source.splitlines() if not x.lstrip().startswith(("%", "!")))
            exec(compile(source, f"<cell {i}>", "exec"), ns)
    return ns


def request_cells(notebook: Path, workdir: Path) -> list[dict]:
    """The sandbox request's cells: every test cell's check calls, answers pickled by value."""
    ns = solution_answers(notebook)
    cells = []
    for index, cell in enumerate(nbformat.read(notebook, as_version=4).cells):
        meta = cell.metadata.get("nbgrader", {})
        if cell.cell_type != "code" or not meta.get("grade") or meta.get("solution"):
            continue
        calls = []
        for k, call in enumerate(graded_calls(cell.source)):
            payload = workdir / f"cell{index}-{k}.pkl"
            payload.write_bytes(cloudpickle.dumps(eval(call["answer"], ns)))
            calls.append({"lab": call["lab"], "check": call["check"], "hidden": call["hidden"],
                          "name": call["answer"], "payload": str(payload)})
        if calls:
            cells.append({"key": index, "calls": calls})
    return cells


@contextlib.contextmanager
def counting_launches(into: list):
    """Append each launch's nproc to ``into`` while the block runs (both grading paths)."""
    real = harness.launch_tasks

    def launch(*args, **kwargs):
        into.append(kwargs["nproc"])
        return real(*args, **kwargs)
    harness.launch_tasks = shared_launches.launch_tasks = launch
    try:
        yield
    finally:
        harness.launch_tasks = shared_launches.launch_tasks = real


def grade(cells: list[dict], shared: bool) -> tuple[list, float]:
    start = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        decided = sandbox.shared_verdicts(cells) if shared else {}
        verdicts = [[v["passed"] for v in sandbox.grade_cell(
            cell["calls"], {i: v for (key, i), v in decided.items() if key == cell["key"]})]
            for cell in cells]
    return verdicts, time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("labs", nargs="*", default=["00-setup", "03-tensor-parallel"])
    args = parser.parse_args()
    agree = True
    print(f"{'lab':22} {'calls':>5} {'shared':>16} {'alone':>16} {'shared / alone':>15}")
    for lab in args.labs:
        (notebook,) = sorted((REPO / "solutions" / lab).glob("*.ipynb"))
        with tempfile.TemporaryDirectory() as tmp:
            cells = request_cells(notebook, Path(tmp))
            launches = {True: [], False: []}
            results = {}
            for shared in (True, False):
                with counting_launches(launches[shared]):
                    results[shared] = grade(cells, shared)
        (v_shared, t_shared), (v_alone, t_alone) = results[True], results[False]
        agree &= v_shared == v_alone
        calls = sum(len(c["calls"]) for c in cells)
        print(f"{lab:22} {calls:5d} {t_shared:7.1f} s {len(launches[True]):3d} launches "
              f"{t_alone:7.1f} s {len(launches[False]):3d} launches {t_shared / t_alone:10.2f}"
              + ("" if v_shared == v_alone else "   VERDICTS DIFFER"))
        if not all(all(v) for v in v_shared):
            print(f"  {lab}: a solution answer failed: {v_shared}")
            agree = False
    print("every verdict agrees, and every solution answer passed" if agree else "MISMATCH")
    return 0 if agree else 1


if __name__ == "__main__":
    sys.exit(main())
