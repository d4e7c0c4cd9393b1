"""Grade handed-in answers in a fresh process: ``python -m parlab.grading.autograde.sandbox REQUEST.json``.

Started by ``parlab.grading.autograde.execute`` once per notebook, after it ran.
The request lists the test cells, each with its check calls in order; each
call names the lab, the check, whether it is the hidden one, the answer's
name and the file holding the answer pickled by value.  Within a cell,
grading stops at the first call that fails.  This process imports the
checks itself (nothing from the student's kernel reaches it), never
unpickles an answer (only the ranks do), and gets back only plain data from
the ranks (``launch(..., plain_results=True)``).

The calls share launches first, one per world size
(``parlab.grading.autograde.shared_launches``); a call that sharing cannot decide is
then graded in launches of its own.
After each cell it rewrites the request's verdict path with a list of
``{"key": cell key, "verdicts": [{"passed": bool, "message": str}, ...],
"printed": what the cell's grading printed}``, so a cell that never
finishes leaves the earlier cells' verdicts in place.  The request may give
the sandbox's time limit in ``"seconds"``: the shared launches below then
start no launch past half of it.
"""
from __future__ import annotations

import contextlib
import importlib
import io
import json
import re
import sys
import time
from pathlib import Path

from ...plainfile import read_plain
from ..harness import Payload, grade_batch, summary
from .shared_launches import grade_shared


def _payload(call: dict) -> Payload:
    """The answer's bytes as the kernel left them: a plain file, never a link or a FIFO the kernel put there.

    Raises ``NotPlainFile`` (an OSError) for anything else, without waiting.
    """
    return Payload(read_plain(call["payload"]))


def _not_handed_in(call: dict, exc: OSError) -> dict:
    return {"passed": False, "message": f"{call['name']} was not handed in for grading: its file is "
            f"{exc.strerror or exc}. It scores 0."}


def _exercise(call: dict):
    """The exercise a call names, or None when no such check exists."""
    lab, check = call["lab"], call["check"]
    if not re.fullmatch(r"lab\d\d", lab) or not re.fullmatch(r"check_\w+", check):
        return None
    try:
        return getattr(importlib.import_module(f"parlab.grading.{lab}"), check).exercise
    except (ImportError, AttributeError):
        return None


def _verdict(exercise, call: dict, message: str | None) -> dict:
    if message:
        return {"passed": False, "message": message}
    return {"passed": True, "message": summary(exercise, str(call["name"]), bool(call["hidden"]))}


def grade_request(call: dict) -> dict:
    """The verdict for one call, graded in launches of its own."""
    exercise = _exercise(call)
    if exercise is None:
        return {"passed": False, "message": f"unknown check {call['lab']}.{call['check']}"}
    name, hidden = str(call["name"]), bool(call["hidden"])
    try:
        answer = _payload(call)
    except OSError as exc:
        return _not_handed_in(call, exc)
    message = grade_batch({exercise: {name: answer}}, hidden=hidden, catch=False,
                          isolate=True)[(exercise.key, name)]
    return _verdict(exercise, call, message)


def shared_verdicts(cells: list[dict], deadline: float | None = None) -> dict:
    """{(cell key, call index): verdict} for the calls graded in shared launches (until ``deadline``)."""
    items, known = [], {}  # known: key -> (exercise, call)
    for cell in cells:
        calls = [(i, call, exercise) for i, call in enumerate(cell["calls"])
                 if (exercise := _exercise(call)) is not None]
        try:
            answers = [_payload(call) for _, call, _ in calls]
        except OSError:
            continue  # an answer not in a plain file: the cell is graded alone, where that is its verdict
        for (i, call, exercise), answer in zip(calls, answers):
            known[(cell["key"], i)] = exercise, call
            items.append(((cell["key"], i), str(call["name"]), exercise, answer, bool(call["hidden"])))
    after = {(cell, i): (cell, i - 1) for cell, i in known if i > 0}  # a cell stops at its first failure
    return {key: _verdict(*known[key], message)
            for key, message in grade_shared(items, after=after, deadline=deadline).items()}


def grade_cell(calls: list[dict], decided: dict | None = None) -> list[dict]:
    """The verdicts of one test cell's calls, stopping at the first that fails.

    ``decided`` holds verdicts already reached in shared launches, by call
    index; the other calls are graded in launches of their own.
    """
    verdicts: list[dict] = []
    for i, call in enumerate(calls):
        try:
            verdicts.append((decided or {}).get(i) or grade_request(call))
        except Exception as exc:  # noqa: BLE001 - the grader's own failure, not the answer's
            verdicts.append({"passed": False, "message": f"the grader failed: {type(exc).__name__}: {exc}"})
        if not verdicts[-1]["passed"]:
            break
        print(verdicts[-1]["message"], flush=True)
    return verdicts


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__.splitlines()[0])
        return 2
    request = json.loads(Path(argv[0]).read_text())
    # the shared launches may use half of the sandbox's time; the cells graded alone keep the rest
    budget = request.get("seconds")
    deadline = time.monotonic() + budget / 2 if budget else None
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            shared = shared_verdicts(request["cells"], deadline)
    except Exception as exc:  # noqa: BLE001 - the shared launches are only a shortcut
        print(f"parlab: shared grading failed ({type(exc).__name__}: {exc}); grading each call "
              "in launches of its own", file=sys.stderr)
        shared = {}
    done: list[dict] = []
    for cell in request["cells"]:
        printed = io.StringIO()
        decided = {i: v for (key, i), v in shared.items() if key == cell["key"]}
        with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(printed):
            verdicts = grade_cell(cell["calls"], decided)
        done.append({"key": cell["key"], "verdicts": verdicts, "printed": printed.getvalue()})
        Path(request["verdict"]).write_text(json.dumps(done))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
