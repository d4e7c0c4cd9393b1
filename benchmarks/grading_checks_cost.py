"""What the checks against forged grading cost per submission, beside the grading itself, in one run.

The checks of this wave, each timed here on the real objects of one graded class:

- **judge**: the reports read as claims (``harness.judge`` checks the shape of every rank's report
  and that every case came back) — timed on complete reports of every lab 00 exercise;
- **spy**: ``Spy.watch()`` now also patches the ``ProcessGroup``/``Backend`` methods and the c10d
  operators, and reads what reached fd 1 — the cost of entering and leaving ``watch()`` once
  per case, beside ``watch()`` with those patches left out (the spy as it was);
- **pid namespace**: both boxes now start with ``--unshare-pid --proc /proc`` — ``bwrap`` started
  with and without them, once per box a submission starts;
- **box folder**: as root, the folder the boxes write for the grader is a tmpfs of the box's own
  — mounted and detached once per submission;
- **refusals**: the submitted folder walked with ``lstat`` for links, FIFOs and hard links;
- **inert**: ``InertOutputs`` on the autograded notebook, and the feedback rendered with
  ``HTMLExporter.sanitize_html`` on beside off.

The grading itself is ``parlab grade --workers 1`` of the same lab 00 class (right, wrong and
blank submissions), run first; every check's seconds per submission are printed beside it, with
their share of it.

    OMP_NUM_THREADS=1 python benchmarks/grading_checks_cost.py [--submissions 3] [--repeat 20]
"""
from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from grade_class import REPO, course_with_class, parlab_grade  # noqa: E402

sys.path.insert(0, str(REPO / "tests"))
import nbformat  # noqa: E402

from nbgrader_harness import source_notebook  # noqa: E402
from parlab.grading import boundary, harness, lab00, spy  # noqa: E402
from parlab.plainfile import unsafe_entry  # noqa: E402

LAB = "00-setup"


def _timed(fn, repeat: int) -> float:
    """Median seconds of one call of ``fn`` over ``repeat`` calls."""
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _exercises():
    return [obj.exercise for obj in vars(lab00).values() if hasattr(obj, "exercise")]


def _cases_per_submission() -> int:
    return sum(ex.count(False) + ex.count(True) for ex in _exercises())


def judge_cost(repeat: int) -> float:
    """The shape and accounting checks over complete reports of every lab 00 task, per submission."""
    record = {"calls": [], "printed": "", "backward": 0, "ddp": 0, "mutated": [], "events": []}
    tasks = [(n, cases) for ex in _exercises() for hidden in (False, True) for n, cases in ex.sets(hidden)]

    def check_all():
        for n, cases in tasks:
            per_rank = [{"cases": [{"out": 0, "spy": record} for _ in cases]} for _ in range(n)]
            harness._malformed(per_rank, n)  # noqa: SLF001 - the benchmark times the private checks
            harness._unaccounted(harness.Graded("f", n, cases, [[0] * len(cases)] * n))  # noqa: SLF001
    return _timed(check_all, repeat)


def spy_cost(repeat: int) -> tuple[float, float]:
    """(watch() now, watch() without the backend methods and operators), per submission."""
    cases = _cases_per_submission()

    def enter_leave():
        with spy.Spy().watch():
            pass
    now = _timed(enter_leave, repeat) * cases
    with _without_new_patches():
        before = _timed(enter_leave, repeat) * cases
    return now, before


@contextlib.contextmanager
def _without_new_patches():
    saved = spy.BACKEND_METHODS, spy.Spy._op_patches  # noqa: SLF001
    spy.BACKEND_METHODS = {}
    spy.Spy._op_patches = lambda self: []  # noqa: SLF001
    try:
        yield
    finally:
        spy.BACKEND_METHODS, spy.Spy._op_patches = saved  # noqa: SLF001


def bwrap_cost(repeat: int) -> tuple[float, float]:
    """(start with a pid namespace and /proc, without), one box, seconds."""
    base = [shutil.which("bwrap"), "--die-with-parent", "--unshare-net", "--ro-bind", "/", "/", "--dev", "/dev"]
    run = lambda extra: subprocess.run(base + extra + ["true"], check=True)  # noqa: E731
    return _timed(lambda: run(["--unshare-pid", "--proc", "/proc"]), repeat), _timed(lambda: run([]), repeat)


def mount_cost(repeat: int) -> float | None:
    """Mount and detach one box folder's tmpfs (root only; None otherwise)."""
    if os.geteuid() != 0:
        return None
    folder = Path(tempfile.mkdtemp(prefix="parlab-bench-mount-"))

    def once():
        assert boundary._mount_tmpfs(folder, 512 << 20)  # noqa: SLF001
        boundary._unmount(folder)  # noqa: SLF001
    try:
        return _timed(once, repeat)
    finally:
        folder.rmdir()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--submissions", type=int, default=3)
    p.add_argument("--repeat", type=int, default=20)
    args = p.parse_args()
    base = Path(tempfile.mkdtemp(prefix="parlab-checks-cost-"))
    root = course_with_class(base, "course", LAB, args.submissions)
    grading = parlab_grade(root, LAB, 1) / args.submissions
    autograded = sorted((root / "autograded").glob(f"*/{LAB}/{source_notebook(LAB).name}"))
    submitted = sorted((root / "submitted").glob(f"*/{LAB}"))
    nb = nbformat.read(autograded[0], as_version=4)

    from nbconvert.exporters import HTMLExporter
    from traitlets.config import Config

    from parlab.grading.autograde import InertOutputs

    def render(sanitize: bool):
        HTMLExporter(config=Config({"HTMLExporter": {"sanitize_html": sanitize}})).from_notebook_node(nb)
    # one kernel box, and a ranks' box per shared launch: one per world size (every answer runs on ranks)
    boxes = 1 + len({n for ex in _exercises() for h in (False, True) for n, _ in ex.sets(h)})
    spy_now, spy_before = spy_cost(args.repeat)
    pid_now, pid_before = bwrap_cost(args.repeat)
    rows = [
        ("judge: every case accounted for", judge_cost(args.repeat), None),
        ("spy: watch() per case, now / as it was", spy_now, spy_before),
        (f"pid namespace: {boxes} box starts, with / without", pid_now * boxes, pid_before * boxes),
        ("box folder: its tmpfs mounted and detached", mount_cost(args.repeat), None),
        ("refusals: the submitted folder walked with lstat",
         _timed(lambda: [unsafe_entry(f) for f in submitted[:1]], args.repeat), None),
        ("inert: InertOutputs on the autograded notebook",
         _timed(lambda: InertOutputs().preprocess(nbformat.from_dict(nb), {}), args.repeat), None),
        ("inert: feedback rendered, sanitize_html on / off",
         _timed(lambda: render(True), args.repeat), _timed(lambda: render(False), args.repeat)),
    ]
    print(f"{LAB}: parlab grade --workers 1 of {args.submissions} submissions: {grading:.1f} s per submission "
          f"({os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f})")
    print(f"{'check':<52} {'s/submission':>13} {'beside':>9} {'added':>9} {'share':>7}")
    added_total = 0.0
    for name, now, before in rows:
        if now is None:
            print(f"{name:<52} {'(not root)':>13}")
            continue
        added = now - (before or 0.0)
        added_total += added
        print(f"{name:<52} {now:>13.4f} {before if before is not None else float('nan'):>9.4f} "
              f"{added:>9.4f} {added / grading:>7.2%}")
    print(f"\nadded by the checks: {added_total:.3f} s per submission, {added_total / grading:.2%} of its grading")
    shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
