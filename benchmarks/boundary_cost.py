"""What the grading boundary costs per submission: the same class graded with and without it, side by side.

Two course copies get the very same lab 00 class (``grade_class.course_with_class``: right, wrong and
blank submissions); one of them turns the boundary off (``c.GuardedExecute.boundary = False``).
Each round grades both with ``parlab grade LAB --force --workers 1``, in alternating order so that
a change in the machine's load falls on both.  It prints each run's seconds per submission, the
ratio boxed / unboxed, the difference per submission, whether the scores agree, and the load
average (the machine may be shared).

    OMP_NUM_THREADS=1 python benchmarks/boundary_cost.py [--lab 00-setup] [--submissions 4] [--rounds 2]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from grade_class import REPO, course_with_class, parlab_grade  # noqa: E402

sys.path.insert(0, str(REPO / "tests"))
from class_course import gradebook_scores  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--lab", default="00-setup")
    p.add_argument("--submissions", type=int, default=4)
    p.add_argument("--rounds", type=int, default=2)
    args = p.parse_args()
    base = Path(tempfile.mkdtemp(prefix="parlab-boundary-cost-"))
    courses = {"boxed": course_with_class(base, "boxed", args.lab, args.submissions),
               "unboxed": course_with_class(base, "unboxed", args.lab, args.submissions)}
    with open(courses["unboxed"] / "nbgrader_config.py", "a") as f:
        f.write("\nc.GuardedExecute.boundary = False\n")
    per_sub: dict[str, list[float]] = {"boxed": [], "unboxed": []}
    print(f"{args.lab}, {args.submissions} submissions per run, parlab grade --workers 1, {os.cpu_count()} cores")
    print(f"{'round':>5} {'run':>8} {'s/submission':>13} {'load avg':>9}")
    for r in range(args.rounds):
        for name in (("boxed", "unboxed") if r % 2 == 0 else ("unboxed", "boxed")):
            seconds = parlab_grade(courses[name], args.lab, 1, "--force") / args.submissions
            per_sub[name].append(seconds)
            print(f"{r + 1:>5} {name:>8} {seconds:>13.1f} {os.getloadavg()[0]:>9.2f}", flush=True)
    boxed, unboxed = (statistics.mean(per_sub[k]) for k in ("boxed", "unboxed"))
    same = gradebook_scores(courses["boxed"], args.lab) == gradebook_scores(courses["unboxed"], args.lab)
    print(f"\nmean s/submission: boxed {boxed:.1f}, unboxed {unboxed:.1f}; ratio boxed/unboxed "
          f"{boxed / unboxed:.2f}; the boundary adds {boxed - unboxed:+.1f} s per submission; "
          f"scores equal: {same}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
