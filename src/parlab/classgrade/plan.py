"""What one run of ``parlab grade`` grades, for either scheduler (local workers or a Slurm array).

``select`` finds the submissions that have no merged grade, changed since
it, or lost their ``autograded/`` folder (all of them with ``force``; only
the named students', graded again, with ``students``), and the ones turned
away as bad input.  ``begin`` then ends what a run that was
killed outright may have left (its local workers, its Slurm array job),
snapshots the gradebook for the course copies and, with ``resume``, merges
the copies that run had finished grading; what is left is the queue.
``merge_one`` is the one writer's step, shared by both schedulers.
"""
from __future__ import annotations

from pathlib import Path

from . import array_slurm, inputs, merge, processes, worker
from .report import Progress


def require_boundary(root: Path) -> None:
    """Refuse to grade (CourseError saying how to install it) when the boundary is on and bwrap is missing."""
    from ..grading.boundary import BoundaryError, bwrap_path

    if inputs.load_config(root).GuardedExecute.get("boundary", True):
        try:
            bwrap_path()
        except BoundaryError as exc:
            raise inputs.CourseError(str(exc)) from None


def select(root: Path, lab: str, force: bool, out=None,
           students: list[str] | None = None) -> tuple[inputs.Course, list[inputs.Submission], Progress]:
    c = inputs.course(root)
    require_boundary(c.root)
    a = inputs.assignment(c, lab)
    subs, rejected = inputs.find(c, a)
    if students:
        subs, rejected = only(students, lab, subs, rejected)
    todo = [s for s in subs if force or students or not merge.up_to_date(c, s)]
    progress = Progress(lab, [s.student for s in todo], out)
    progress.rejected = {r.student: r.reason for r in rejected}
    progress.skipped = [s.student for s in subs if s not in todo]
    progress.absent = [] if students else inputs.absent(a, subs, rejected)
    return c, todo, progress


def only(students: list[str], lab: str, subs: list[inputs.Submission],
         rejected: list[inputs.Rejected]) -> tuple[list[inputs.Submission], list[inputs.Rejected]]:
    """The named students' submissions and rejections (``--student``): the rest of the class is left alone.

    A named submission is graded again even when unchanged since its grade
    (``select``): the lab's checks were fixed, or an extension's late
    submission is to be graded alone.  A name with nothing under
    ``submitted/`` is a CourseError saying to collect it first.
    """
    handed_in = {s.student for s in subs} | {r.student for r in rejected}
    missing = [s for s in dict.fromkeys(students) if s not in handed_in]
    if missing:
        raise inputs.CourseError(f"no submission of {lab} from {', '.join(missing)} (submitted/<student>/{lab}); "
                                 f"collect it first: nbgrader collect {lab} --student <student>")
    return [s for s in subs if s.student in students], [r for r in rejected if r.student in students]


#: Seconds added to the default ``--timeout``: starting the kernel and the boxes, nbgrader's own steps
#: and the feedback, on a loaded machine (a correct lab 00 submission took 50-80 s in all on the 2-core
#: test machine, graded two at a time).
TIMEOUT_MARGIN = 600


def cell_counts(c: inputs.Course, lab: str) -> tuple[int, int]:
    """(code cells, test cells) of the lab's notebooks in the source folder: the assignment's, not a student's."""
    import nbformat

    code = tests = 0
    for path in sorted((c.source / lab).glob("*.ipynb")):
        for cell in nbformat.read(path, as_version=4).cells:
            if cell.cell_type == "code":
                meta = cell.metadata.get("nbgrader", {})
                code += 1
                tests += bool(meta.get("grade") and not meta.get("solution"))
    return code, tests


def default_timeout(c: inputs.Course, lab: str) -> float | None:
    """The default ``--timeout``: what the grader's own limits allow one submission, plus ``TIMEOUT_MARGIN``.

    ``Execute.timeout`` (the course's, 300 s) for each code cell of the
    lab's notebooks, and as much again for each test cell (handing its
    answers in, and its share of the sandbox, which gets ``Execute.timeout``
    per test cell).  Only a submission stuck past every one of those limits
    reaches it; a kernel killed and restarted many times (each restart
    replays the cells above) can need more.  None when cells have no time
    limit (``Execute.timeout = None``).
    """
    from ..grading.autograde import GuardedExecute

    per_cell = GuardedExecute(config=inputs.load_config(c.root)).timeout
    if not per_cell:
        return None
    code, tests = cell_counts(c, lab)
    return float(per_cell * (code + 2 * tests) + TIMEOUT_MARGIN)


def submission_timeout(c: inputs.Course, lab: str, given: float | None) -> float | None:
    """The seconds one submission may take: ``given`` (0: no limit), else ``default_timeout``."""
    if given is None:
        return default_timeout(c, lab)
    return given or None


def announce(c: inputs.Course, lab: str, todo: list, progress: Progress, how: str,
             timeout: float | None = None) -> None:
    print(f"parlab grade {lab}: {len(todo)} to grade {how}, {len(progress.skipped)} unchanged, "
          f"{len(progress.rejected)} rejected (work dir {c.workdir})", file=progress.out, flush=True)
    if todo:
        limit = f"at most {timeout:g} s each" if timeout else "no time limit"
        print(f"          {limit} (--timeout)", file=progress.out, flush=True)
    for student, why in sorted(progress.rejected.items()):
        print(f"          {student:<16} rejected {why}", file=progress.out, flush=True)


def end_stale_workers(c: inputs.Course, lab: str) -> None:
    """Workers of a local scheduler that was killed outright may still run: end them."""
    for job in (c.workdir / lab).glob("*/job"):
        processes.end_job(job.read_text().strip())
        job.unlink(missing_ok=True)


def begin(c: inputs.Course, lab: str, todo: list, progress: Progress, resume: bool) -> tuple[list, Path]:
    """(the submissions still to grade, the gradebook snapshot for their copies)."""
    end_stale_workers(c, lab)
    array_slurm.cancel_stale(c.workdir / lab)
    template = c.workdir / lab / "gradebook-template.db"
    worker.snapshot_gradebook(c, template)
    queue = list(todo)
    if resume:
        for sub in list(queue):
            if (copy := _resumable(c, sub)) is not None:
                queue.remove(sub)
                merge_one(c, copy, sub, progress, worker.result(copy)["seconds"])
    return queue, template


def _resumable(c: inputs.Course, sub: inputs.Submission) -> Path | None:
    """A copy of this very hand-in that a stopped run graded but did not merge."""
    root = worker.copy_root(c, sub)
    got = worker.result(root)
    try:
        same = (root / "digest").read_text() == sub.digest
    except OSError:
        same = False
    return root if same and got and got.get("ok") else None


def merge_one(c: inputs.Course, copy: Path, sub: inputs.Submission, progress: Progress, seconds: float) -> None:
    try:
        progress.done(sub.student, merge.merge(c, copy, sub), seconds)
    except Exception as exc:  # noqa: BLE001 - one submission's merge must not stop the others
        progress.fail(sub.student, f"merging into the gradebook failed: {type(exc).__name__}: {exc}")
