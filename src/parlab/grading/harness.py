"""The grading harness every lab uses.

An exercise is declared once, as an ``Exercise``: what runs on each rank,
how the results are graded, its visible and hidden cases, the rules the
notebook states, and its hints.  A lab module holds only those declarations
and its graders; ``checker(exercise)`` turns one into the ``check_*``
function the notebook's test cell calls, and ``grade_batch`` grades many
answers (the test suite's wrong answers) in one launch per world size.

How one answer is graded:

1. On every rank, for each case, ``exercise.run(answer, case, i, spy)``
   calls the student's code inside ``spy.watch()`` and returns plain data.
   With ``exercise.settle`` the ranks agree after each case whether any of
   them got it wrong, and stop that answer together: a wrong answer is
   reported on its first wrong case, before a later case can crash it.
2. In the grader, a launch failure becomes one message, from its
   classification (``parlab.launch.failures.classify``): a hang, a rank that
   died, a mismatched message, an exception in the student's code.
3. Otherwise ``exercise.grade(graded)`` compares the values with a
   single-process reference and returns a message: it names a mistake only
   as ``parlab.grading.diagnosis`` allows (the evidence of every case, rank
   and step fits that mistake and no other), and otherwise says what differs.
4. If the values are right, each ``Rule`` is judged on the spy's records
   (its message names the call, ``parlab.grading.records.describe``):
   right numbers reached the wrong way (``dist.all_reduce`` inside a "ring",
   an input overwritten, one backward pass instead of one per micro-batch)
   still fail, with the notebook's own words quoted.

Tasks, the seam for whatever else runs answers (``shared_launches``): a
task is ``(key, exercise, answer, cases)``.  On the ranks ``run_tasks``
runs a list of them (``run_task`` one), keyed by ``task_slot(key)``, and
notes the backend under ``BACKEND_KEY``; ``launch_tasks`` starts the ranks;
in the grader ``judge`` turns one task's per-rank output into its message.

Isolation: during ``nbgrader autograde`` the notebook's kernel cannot be
trusted (a cell may have replaced a check, ``parlab`` or torch).  There the
check in the kernel only says it was recorded; ``parlab.grading.autograde``
sends the answer by value to ``parlab.grading.autograde.sandbox``, a fresh process
that runs ``grade_batch(..., isolate=True)``: the answer is unpickled only on
the ranks, and the ranks' results come back as plain data that cannot run
code in the grader.
"""
from __future__ import annotations

import os
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .. import check
from .spy import Spy

#: Set by ``parlab.grading.autograde`` while nbgrader runs a submission.
AUTOGRADE_ENV = "PARLAB_AUTOGRADE"


@dataclass(frozen=True)
class Rule:
    """A rule the notebook states in so many words, and how to tell it was broken.

    ``says`` is the notebook's sentence, verbatim (a test finds it in the
    exercise's text).  ``broken(records, case, n)`` gets every rank's spy
    record for one case and returns what the answer did wrong, or None.
    """

    says: str
    broken: Callable[[list[dict], Any, int], str | None]


@dataclass(frozen=True)
class Exercise:
    """One graded exercise of a lab (see the module docstring)."""

    key: str                  # "lab01.ring": unique across labs
    answer: str               # what the student hands in, for messages: "ring_allreduce"
    run: Callable             # on each rank: run(answer, case, i, spy) -> plain data
    grade: Callable           # in the grader: grade(Graded) -> message or None
    visible: tuple            # ((world_size, (case, ...)), ...)
    hidden: tuple
    rules: tuple = ()
    on_hang: str = ""         # hint when the ranks waited for each other
    on_mismatch: str = ""     # hint when a message and its buffer differ in size or dtype
    on_error: Callable | None = None  # on_error(error text) -> hint, or ""
    settle: Callable | None = None    # on each rank: settle(result, case, i, n) -> right?
    timeout: float = 60.0
    solo: bool = False        # a plain function: graded in-process unless isolated
    kind: str = "function"    # "function" or "class", for messages

    def sets(self, hidden: bool) -> tuple:
        return self.hidden if hidden else self.visible

    def count(self, hidden: bool) -> int:
        return sum(len(cases) for _, cases in self.sets(hidden))


@dataclass
class Graded:
    """What a grader sees: each rank's per-case results for one answer."""

    name: str
    n: int
    cases: Sequence
    results: list[list]       # results[rank][case]
    backend: str = "gloo"
    records: list[list] = field(default_factory=list)  # records[rank][case]: spy records

    def at(self, i: int) -> list:
        """Every rank's result for case ``i``."""
        return [per_rank[i] for per_rank in self.results]


@dataclass(frozen=True)
class Payload:
    """An answer sent by value as pickled bytes; unpickled only on the ranks."""

    data: bytes


# ---------------------------------------------------------------- on the ranks
#: Where the ranks report the backend they ran on, so tolerances follow it.
BACKEND_KEY = "__backend__"


def _resolve(answer):
    if isinstance(answer, Payload):
        import cloudpickle

        return cloudpickle.loads(answer.data)
    return answer


def _all_right(right: bool) -> bool:
    """Every rank's verdict on the last case, agreed with one tiny all_reduce."""
    import torch
    import torch.distributed as dist

    from ..launch.runtime import device

    if not dist.is_initialized():
        return right
    flag = torch.tensor([0.0 if right else 1.0], device=device())
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return not bool(flag.item())


def task_slot(key: tuple[str, str]) -> str:
    """A task's key as a str: plain results (``launch(plain_results=True)``) allow only str/int keys."""
    return "\n".join(key)


def run_tasks(tasks: list, catch: bool) -> dict:
    """Run each task ``(key, exercise, answer, cases)``; {task_slot(key): {"cases": [...]} or {"error": ...}}."""
    import torch.distributed as dist

    n = dist.get_world_size() if dist.is_initialized() else 1
    backend = str(dist.get_backend()) if dist.is_initialized() else "gloo"
    out: dict = {BACKEND_KEY: backend}
    with check.judged_on(backend):
        for key, ex, answer, cases in tasks:
            out[task_slot(key)] = run_task(ex, answer, cases, n, catch)
    return out


def run_task(ex: Exercise, answer, cases, n: int, catch: bool, note: str = "") -> dict:
    """One answer through its cases on this rank: {"cases": [...]} or {"error": ..., "traceback": ...}.

    Without ``catch``, an exception leaves with ``note`` as its last note (if given).
    """
    done: list = []
    case = None
    try:
        obj = _resolve(answer)
        for i, case in enumerate(cases):
            spy = Spy()
            got = ex.run(obj, case, i, spy)
            done.append({"out": got, "spy": spy.record()})
            if ex.settle is not None and not _all_right(bool(ex.settle(got, case, i, n))):
                break
    except Exception as exc:  # noqa: BLE001 - reported in the student's terms
        where = _case_words(case, n)
        if not catch:
            if hasattr(exc, "add_note"):  # Python 3.11+: name the case under the traceback
                exc.add_note(f"(while grading {where})")
                if note:
                    exc.add_note(note)
            raise
        last = traceback.format_exception_only(type(exc), exc)[-1].strip()
        return {"error": f"raised {last} on {where}", "traceback": traceback.format_exc(limit=-4)}
    return {"cases": done}


def _case_words(case, n: int) -> str:
    describe = getattr(case, "describe", None)
    return describe(n) if describe else f"case {case!r}, world_size {n}"


# ---------------------------------------------------------------- in the grader
def launch_tasks(fn, args: tuple, *, nproc: int, timeout: float, isolate: bool, backend: str | None):
    """``fn(*args)`` on ``nproc`` ranks; each rank's return (plain data only when ``isolate``)."""
    from .. import launch

    kwargs = {"plain_results": True} if isolate else {}
    return launch(fn, args=args, nproc=nproc, timeout=timeout, backend=backend, **kwargs)


def grade_batch(batch: Mapping[Exercise, Mapping[str, Any]], *, hidden: bool = False,
                timeout: float | None = None, catch: bool = True, isolate: bool = False,
                backend: str | None = None) -> dict[tuple[str, str], str | None]:
    """Grade many answers, ``{exercise: {name: answer}}``; {(exercise.key, name): message or None}.

    All answers that need the same world size share one launch.  With
    ``catch``, an exception in one answer is recorded and the others go on
    (one that raises on only some ranks leaves the rest waiting until the
    process-group timeout).  ``isolate`` is the sandbox's mode: every
    answer, plain functions too, runs on ranks and comes back as plain data.
    """
    report: dict[tuple[str, str], str | None] = {(ex.key, name): None
                                                for ex, answers in batch.items() for name in answers}
    sizes = sorted({n for ex in batch for n, _ in ex.sets(hidden)}, reverse=True)
    for n in sizes:
        tasks = [((ex.key, name), ex, answer, tuple(cases))
                 for ex, answers in batch.items() for name, answer in answers.items()
                 for m, cases in ex.sets(hidden) if m == n and report[(ex.key, name)] is None]
        if not tasks:
            continue
        wait = timeout or max(ex.timeout for _, ex, _, _ in tasks)
        in_process = n == 1 and not isolate and all(ex.solo for _, ex, _, _ in tasks)
        try:
            per_rank = ([run_tasks(tasks, True)] if in_process else
                        launch_tasks(run_tasks, (tasks, catch), nproc=n, timeout=wait, isolate=isolate, backend=backend))
        except Exception as err:  # noqa: BLE001 - a LaunchError, or a solo answer that raised
            message = launch_failure(err, tasks, n)
            for key, *_ in tasks:
                report[key] = message
            continue
        used = reported_backend(per_rank)
        for key, ex, _, cases in tasks:
            report[key] = judge(ex, key[1], n, cases, [report_of(out, task_slot(key)) for out in per_rank], used)
    return report


def report_of(out, slot: str):
    """One task's report in a rank's output, or None when the output is not a dict or lacks it."""
    return out.get(slot) if isinstance(out, dict) else None


def reported_backend(per_rank: list) -> str:
    """The backend rank 0 says it ran on (its tolerances are used), when it could have: gloo otherwise.

    The claim is the rank's own; nccl's looser tolerances are believed only
    where this side sees a GPU too.
    """
    said = per_rank[0].get(BACKEND_KEY) if per_rank and isinstance(per_rank[0], dict) else None
    if said == "nccl":
        import torch

        return "nccl" if torch.cuda.is_available() else "gloo"
    return said if said in ("gloo", "mpi", "ucc") else "gloo"


def judge(ex: Exercise, name: str, n: int, cases, per_rank: list, backend: str) -> str | None:
    """The message for one task from every rank's ``run_task`` output, or None when it passed.

    ``per_rank`` is what came back, which the answer could have written
    itself (it runs in the process that reports): it is read as claims, never
    as a verdict.  A report not shaped as ``run_task`` writes fails; so does
    one that accounts for fewer (or more) cases than were sent, on any rank,
    even when every value that did come back is right.
    """
    problem = _malformed(per_rank, n)
    if problem:
        return f"{name} was not graded: {problem}"
    errors = [(r, out) for r, out in enumerate(per_rank) if "error" in out]
    if errors:
        r, out = errors[0]
        hint = ex.on_error(str(out.get("traceback", ""))) if ex.on_error else ""
        return (f"{name} {out['error']} (rank {r}).\n{out.get('traceback', '')}"
                + (f"\nHint: {hint}" if hint else ""))
    graded = Graded(name, n, cases, [[c["out"] for c in out["cases"]] for out in per_rank], backend,
                    [[c["spy"] for c in out["cases"]] for out in per_rank])
    missing = _unaccounted(graded)
    try:
        with check.judged_on(backend):
            message = ex.grade(graded)
    except Exception:  # noqa: BLE001 - a grader reading a case that never came back
        if not missing:
            raise
        message = None
    return message or missing or rules_message(ex, graded)


def _malformed(per_rank: list, n: int) -> str | None:
    """What is wrong with the shape of the ranks' reports of one task, or None."""
    if len(per_rank) != n:
        return f"{len(per_rank)} ranks reported, but {n} ran."
    for r, out in enumerate(per_rank):
        if not isinstance(out, dict) or not ("error" in out or "cases" in out):
            return f"rank {r} sent back no report for it."
        if "error" in out:
            if not isinstance(out["error"], str):
                return f"rank {r}'s error report is not text."
            continue
        cases = out["cases"]
        if not isinstance(cases, list) or not all(
                isinstance(c, dict) and "out" in c and isinstance(c.get("spy"), dict) for c in cases):
            return f"rank {r}'s report is not the list of per-case results the harness writes."
    return None


def _unaccounted(graded: Graded) -> str | None:
    """A message naming the first case some rank sent no result for (or one too many), or None."""
    want = len(graded.cases)
    for r, per_rank in enumerate(graded.results):
        if len(per_rank) > want:
            return (f"{graded.name}: rank {r} reported {len(per_rank)} results for {want} cases; "
                    "it was not graded.")
    for i, case in enumerate(graded.cases):
        short = [r for r, per_rank in enumerate(graded.results) if len(per_rank) <= i]
        if short:
            return (f"{graded.name} gave no result for {_case_words(case, graded.n)} on rank "
                    f"{short[0]} ({len(graded.results[short[0]])} of {want} cases came back from "
                    "that rank). Every case must run to the end on every rank to score.")
    return None


def rules_message(ex: Exercise, graded: Graded) -> str | None:
    """The first stated rule the answer broke, quoted, or None."""
    ran = min(len(r) for r in graded.records) if graded.records else 0
    for i in range(ran):
        records = [per_rank[i] for per_rank in graded.records]
        for rule in ex.rules:
            what = rule.broken(records, graded.cases[i], graded.n)
            if what:
                return (f"{graded.name} gives the right values for {_case_words(graded.cases[i], graded.n)}, "
                        f"but {what}\nThe exercise says: \"{rule.says}\"")
    return None


# ---------------------------------------------------------------- launch failures
_GENERIC = {
    "hang": "did not finish: the ranks waited for each other (a rank waited for a message or "
            "collective that another rank never posted)",
    "died": "crashed: a rank process died",
    "mismatch": "failed: a message and its receive buffer differed in size or dtype, and gloo "
                "aborted the launch",
    "transient": "could not start: the ranks failed to connect while the group formed. This is "
                 "not your code's fault; run the check again",
    "interrupted": "was interrupted",
}


def launch_failure(err: BaseException, tasks: list, n: int) -> str:
    """One message for a launch that failed, in the student's terms."""
    names = ", ".join(sorted({key[1] for key, *_ in tasks}))
    exercises = {ex.key: ex for _, ex, _, _ in tasks}.values()
    tried = "; ".join(sorted({_case_words(c, n).rsplit(", world_size", 1)[0]
                              for *_, cases in tasks for c in cases}))
    failure = _classify(err)
    if failure.kind == "raised" or not hasattr(err, "failures") and failure.kind == "other":
        text = str(err)
        hints = {h for ex in exercises if ex.on_error and (h := ex.on_error(text))}
        return (f"{names} raised an error on {n} rank{'s' if n > 1 else ''}.\n{text}"
                + "".join(f"\nHint: {h}" for h in sorted(hints)))
    what = _GENERIC.get(failure.kind, "failed")
    hints: set[str] = set()
    if failure.kind == "hang":
        hints = {ex.on_hang for ex in exercises if ex.on_hang}
    elif failure.kind == "mismatch":
        hints = {ex.on_mismatch for ex in exercises if ex.on_mismatch}
    detail = f" ({failure.detail})" if failure.detail else ""
    return (f"{names} {what} on {n} ranks{detail}, in one of these cases: {tried}.\n"
            + "".join(f"Hint: {h}\n" for h in sorted(hints)) + f"\n{err}")


def _classify(err: BaseException):
    from ..launch.failures import classify

    return classify(err)


# ---------------------------------------------------------------- public checks
def _plural(count: int, word: str) -> str:
    return f"{count} {word}" + ("" if count == 1 else "s")


def summary(ex: Exercise, name: str, hidden: bool) -> str:
    """The line a passing check prints: "ring_allreduce: 10 visible cases passed on 4 ranks"."""
    sizes = sorted({n for n, _ in ex.sets(hidden)})
    where = "" if ex.solo else " on " + " and ".join(map(str, sizes)) + " ranks"
    verb = "passed"
    return f"{name}: {_plural(ex.count(hidden), 'hidden case' if hidden else 'visible case')} {verb}{where}"


def checker(ex: Exercise, doc: str) -> Callable:
    """The ``check_*`` function a notebook's test cell calls for ``ex``."""
    def check_answer(answer, *, hidden: bool = False, timeout: float | None = None) -> None:
        __tracebackhide__ = True  # noqa: F841 - IPython hides this frame from students
        if os.environ.get(AUTOGRADE_ENV):
            print(f"{getattr(answer, '__name__', ex.answer)}: recorded; graded in a separate process")
            return
        if not callable(answer):
            raise AssertionError(f"expected your {ex.answer} ({ex.kind}), got "
                                 f"{type(answer).__name__}: did the cell that defines it run?")
        name = getattr(answer, "__name__", ex.answer)
        message = grade_batch({ex: {name: answer}}, hidden=hidden, timeout=timeout,
                              catch=False)[(ex.key, name)]
        if message:
            raise AssertionError(message)
        print(summary(ex, name, hidden))

    check_answer.exercise = ex
    check_answer.__doc__ = doc
    return check_answer
