"""A class graded three ways, side by side: serial nbgrader, ``parlab grade`` at 1 and 2 workers.

For each lab a class of synthetic submissions is made from the student
version (cut to its graded cells, see ``tests/class_course.py``): in turn
the solution's answers, a wrong answer per exercise from
``tests/wrong_answers/labNN.py`` (the first fixture each exercise lists),
and now and then the blank release, so the class is mixed right and wrong.
The same class is graded in separate course copies:

- serially: ``nbgrader autograde LAB --force`` then ``nbgrader generate_feedback LAB --force``;
- ``parlab grade LAB --workers W`` for each W (which also writes feedback).

It prints each run's wall time, submissions per hour, the speed-up over
serial nbgrader, the speed-up ÷ W (the efficiency), whether every score
equals the serial score, and the load average (the machine may be shared).
Then it projects a class of 100 students x every lab under solutions/ on a 112-core host (see
``projection``).

    OMP_NUM_THREADS=1 python benchmarks/grade_class.py [--labs 00-setup 01-collectives] [--per-lab 20] [--workers 1 2]
"""
from __future__ import annotations

import argparse
import importlib
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from class_course import (add_students, gradebook_scores, make_course, notebook, serial_autograde,  # noqa: E402
                          submit, tool_env)

from nbgrader_harness import lab_names  # noqa: E402

from parlab.classgrade.run import widest_launch  # noqa: E402

#: Seconds per submission from the README / docs/instructor.md measurements (autograde of two
#: students, the solution whole and the blank cut to its graded cells, idle 2-core machine), used
#: for the labs this run does not measure.  Labs 03, 04 and 07 have no per-lab figure there.
DOCUMENTED = {"00-setup": 62 / 2, "01-collectives": 136 / 2, "02-data-parallel": 165 / 2,
              "05-sharding": 214 / 2, "06-3d-parallel": 182 / 2}
LABS = lab_names()  # every lab under solutions/, so a new lab joins the projection


def class_of(lab: str, root: Path, count: int) -> dict:
    """{student: notebook}: solution, wrong answers in turn, and every fifth one blank."""
    wrong = importlib.import_module(f"wrong_answers.lab{lab[:2]}").WRONG
    fixtures = [(exercise, cases[0][0]) for exercise, cases in wrong.items()]
    out = {}
    for i in range(count):
        if i % 5 == 4:
            out[f"s{i:03d}"] = notebook(lab, root, blank=True)
        elif i % 2 == 0:
            out[f"s{i:03d}"] = notebook(lab, root)
        else:
            out[f"s{i:03d}"] = notebook(lab, root, wrong=fixtures[(i // 2) % len(fixtures)])
    return out


def course_with_class(base: Path, name: str, lab: str, count: int) -> Path:
    root = make_course(base / name, [lab])
    students = class_of(lab, root, count)
    add_students(root, list(students))
    for student, nb in students.items():
        submit(root, student, lab, nb)
    return root


def parlab_grade(root: Path, lab: str, workers: int, *extra: str) -> float:
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "parlab", "grade", lab, "--workers", str(workers), *extra], cwd=root,
                          env=tool_env(), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"parlab grade {lab} --workers {workers} failed:\n{proc.stdout[-4000:]}")
    return time.perf_counter() - start


def projection(measured: dict[str, float], efficiency: float, cores: int = 112,
               students: int = 100) -> list[str]:
    """Hours for ``students`` x every lab on ``cores`` cores.

    Assumptions, stated in the output: one submission costs on the big host
    what it cost here per submission serially (same per-core speed; a DGX
    core is likely faster, so this leans long); W = cores // the lab's
    widest launch workers; throughput = W x efficiency / cost, with the
    efficiency measured here at the largest W, capped at 1 (more workers
    cannot do better than one each).  Labs with no measured or documented
    cost use the largest known per-submission cost.
    """
    eff = min(1.0, efficiency)
    per_submission = dict(DOCUMENTED, **measured)
    fallback = max(per_submission.values())
    lines, total = [], 0.0
    for lab in LABS:
        source = "measured here" if lab in measured else "docs/instructor.md" if lab in DOCUMENTED \
            else "no figure: the largest known cost"
        cost = per_submission.get(lab, fallback)
        workers = max(1, cores // widest_launch(lab))
        hours = students * cost / (workers * eff) / 3600
        total += hours
        lines.append(f"  {lab:22} {cost:6.1f} s/submission ({source}), {workers:3d} workers: {hours:5.2f} h")
    serial = students * sum(per_submission.get(lab, fallback) for lab in LABS) / 3600
    lines.append(f"  total {total:.2f} h on {cores} cores (efficiency {eff:.2f} assumed at every W), "
                 f"against {serial:.1f} h serially")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--labs", nargs="*", default=["00-setup", "01-collectives"])
    parser.add_argument("--per-lab", type=int, default=20)
    parser.add_argument("--workers", nargs="*", type=int, default=[1, 2])
    args = parser.parse_args()
    rows, per_submission, agree, effs = [], {}, True, {}

    def row(*r):  # printed as soon as it is measured, so a run cut short still reports what it did
        rows.append(r)
        lab, how, w, t, _, eff, same, load = r
        print(f"measured: {lab} {how} W={w}: {t:.1f} s, {args.per_lab * 3600 / t:.0f} subs/h"
              f"{'' if eff is None else f', ÷W {eff:.2f}'}, scores = serial: {same}, load {load:.2f}", flush=True)

    with tempfile.TemporaryDirectory(prefix="parlab-grade-bench-") as tmp:
        for lab in args.labs:
            base = Path(tmp) / lab
            serial = course_with_class(base, "serial", lab, args.per_lab)
            load = os.getloadavg()[0]
            t_serial = serial_autograde(serial, lab)
            want = gradebook_scores(serial, lab)
            per_submission[lab] = t_serial / args.per_lab
            row(lab, "nbgrader serial", 1, t_serial, 1.0, None, len(want) == args.per_lab, load)
            for w in args.workers:
                root = course_with_class(base, f"parlab-{w}", lab, args.per_lab)
                load = os.getloadavg()[0]
                t = parlab_grade(root, lab, w)
                same = gradebook_scores(root, lab) == want
                agree &= same
                effs.setdefault(w, []).append(t_serial / t / w)
                row(lab, "parlab grade", w, t, t_serial / t, t_serial / t / w, same, load)
    print(f"\n{'lab':16} {'how':16} {'W':>2} {'wall s':>8} {'subs/h':>7} {'speed-up':>8} {'÷ W':>5} "
          f"{'scores = serial':>15} {'load':>5}")
    for lab, how, w, t, speedup, eff, same, load in rows:
        print(f"{lab:16} {how:16} {w:2d} {t:8.1f} {args.per_lab * 3600 / t:7.0f} {speedup:8.2f} "
              f"{'' if eff is None else f'{eff:.2f}':>5} {'yes' if same else 'NO':>15} {load:5.2f}")
    widest = max(effs)
    efficiency = sum(effs[widest]) / len(effs[widest])
    print(f"\n{args.per_lab} submissions per lab, {os.cpu_count()} cores here; 'load' is the 1-minute load "
          f"average when the run started.  Projection for 100 students x the {len(LABS)} labs on a 112-core host, from the "
          f"per-submission cost and the efficiency measured at W = {widest} ({efficiency:.2f}):")
    print("\n".join(projection(per_submission, efficiency)))
    print("every score equals the serial nbgrader score" if agree else "SCORES DIFFER from serial nbgrader")
    return 0 if agree else 1


if __name__ == "__main__":
    sys.exit(main())
