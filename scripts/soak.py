"""Run each solution notebook headless several times and report what went wrong.

    .venv/bin/python scripts/soak.py                        # every lab, 3 runs each
    .venv/bin/python scripts/soak.py 00-setup --runs 1      # one lab, once

Each run executes a fresh copy of ``solutions/<lab>/`` in a temporary folder
with nbclient, a new kernel each time, as nbgrader's autograde does (cell
timeout from nbgrader_config.py unless ``--timeout``).  A run ends at the
first cell that raises.  The table gives each run's wall time and its end:
``ok``, ``error`` (the cell and the exception), ``timeout`` (a cell ran past
the timeout) or ``kernel died`` (the kernel process ended mid-run, as in a
crash of ipykernel itself).  The exit code is 1 when any run did not end
``ok``, so the script can gate a release or a CI job.
"""
from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEFAULT_CELL_TIMEOUT = 300  # nbgrader_config.py: c.Execute.timeout


@dataclass
class Run:
    lab: str
    number: int
    seconds: float
    outcome: str      # ok, error, timeout, kernel died
    detail: str = ""


def lab_names() -> list[str]:
    return sorted(p.name for p in (REPO / "solutions").iterdir() if p.is_dir() and any(p.glob("*.ipynb")))


def _failing_cell(nb) -> str:
    """"cell 12 (ex2_ring)": the cell whose error output ended the run."""
    for i, cell in enumerate(nb.cells):
        outputs = cell.get("outputs", [])
        if any(o.get("output_type") == "error" for o in outputs):
            grade_id = cell.metadata.get("nbgrader", {}).get("grade_id")
            return f"cell {i}" + (f" ({grade_id})" if grade_id else "")
    return "a cell"


def run_once(lab: str, number: int, timeout: int, kernel: str) -> Run:
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError, CellTimeoutError, DeadKernelError

    (source,) = sorted((REPO / "solutions" / lab).glob("*.ipynb"))
    with tempfile.TemporaryDirectory(prefix=f"soak-{lab}-") as tmp:
        folder = Path(shutil.copytree(source.parent, Path(tmp) / lab))
        nb = nbformat.read(folder / source.name, as_version=4)
        client = NotebookClient(nb, timeout=timeout, kernel_name=kernel, allow_errors=False,
                                resources={"metadata": {"path": str(folder)}})
        start = time.perf_counter()
        try:
            client.execute()
            outcome, detail = "ok", ""
        except DeadKernelError as exc:
            outcome, detail = "kernel died", str(exc).strip().splitlines()[-1][:160]
        except CellTimeoutError as exc:
            outcome, detail = "timeout", f"{_failing_cell(nb)}: {str(exc).strip().splitlines()[0][:120]}"
        except CellExecutionError as exc:
            outcome = "error"
            detail = f"{_failing_cell(nb)}: {exc.ename}: {str(exc.evalue).splitlines()[0][:120] if exc.evalue else ''}"
        return Run(lab, number, time.perf_counter() - start, outcome, detail)


def table(runs: list[Run]) -> str:
    rows = [("lab", "run", "seconds", "result")]
    rows += [(r.lab, str(r.number), f"{r.seconds:.1f}", r.outcome + (f": {r.detail}" if r.detail else ""))
             for r in runs]
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    lines = [f"{a:<{widths[0]}}  {b:>{widths[1]}}  {c:>{widths[2]}}  {d}" for a, b, c, d in rows]
    lines.insert(1, "-" * max(len(line) for line in lines))
    return "\n".join(lines)


def summary(runs: list[Run]) -> str:
    out = []
    for lab in dict.fromkeys(r.lab for r in runs):
        mine = [r for r in runs if r.lab == lab]
        times = sorted(r.seconds for r in mine)
        bad = {k: sum(r.outcome == k for r in mine) for k in ("error", "timeout", "kernel died")}
        out.append(f"{lab}: {len(mine)} run(s), median {times[len(times) // 2]:.1f} s "
                   f"(min {times[0]:.1f}, max {times[-1]:.1f}); "
                   + ", ".join(f"{v} {k}" for k, v in bad.items()))
    return "\n".join(out)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("labs", nargs="*", help=f"lab folders under solutions/ (default: all, {', '.join(lab_names())})")
    parser.add_argument("--runs", type=int, default=3, help="runs per notebook (default 3)")
    parser.add_argument("--timeout", type=int, default=DEFAULT_CELL_TIMEOUT,
                        help=f"seconds per cell (default {DEFAULT_CELL_TIMEOUT}, as nbgrader_config.py)")
    parser.add_argument("--kernel", default="python3", help="Jupyter kernel name (default python3)")
    args = parser.parse_args(argv)
    labs = args.labs or lab_names()
    unknown = [lab for lab in labs if lab not in lab_names()]
    if unknown:
        parser.error(f"no solution notebook for {', '.join(unknown)}; choose from {', '.join(lab_names())}")
    if args.runs < 1 or args.timeout < 1:
        parser.error("--runs and --timeout must be at least 1")
    runs = []
    for lab in labs:
        for number in range(1, args.runs + 1):
            run = run_once(lab, number, args.timeout, args.kernel)
            runs.append(run)
            print(f"{lab} run {number}: {run.outcome} in {run.seconds:.1f} s", file=sys.stderr, flush=True)
    print(table(runs))
    print()
    print(summary(runs))
    return 0 if all(r.outcome == "ok" for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
