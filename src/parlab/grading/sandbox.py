"""Grade handed-in answers in a fresh process: ``python -m parlab.grading.sandbox REQUEST.json``.

Started by ``parlab.grading.autograde`` once per notebook, after it ran.
The request lists the test cells, each with its check calls in order; each
call names the lab, the check, whether it is the hidden one, the answer's
name and the file holding the answer pickled by value.  Within a cell,
grading stops at the first call that fails.  This process imports the
checks itself (nothing from the student's kernel reaches it), never
unpickles an answer (only the ranks do, one launch per answer), and gets
back only plain data from the ranks (``launch(..., plain_results=True)``).
After each cell it rewrites the request's verdict path with a list of
``{"key": cell key, "verdicts": [{"passed": bool, "message": str}, ...],
"printed": what the cell's grading printed}``, so a cell that never
finishes leaves the earlier cells' verdicts in place.
"""
from __future__ import annotations

import contextlib
import importlib
import io
import json
import re
import sys
from pathlib import Path

from .harness import Payload, grade_batch, summary


def grade_request(request: dict) -> dict:
    """The verdict for one request (see the module docstring)."""
    lab, check = request["lab"], request["check"]
    if not re.fullmatch(r"lab\d\d", lab) or not re.fullmatch(r"check_\w+", check):
        return {"passed": False, "message": f"unknown check {lab}.{check}"}
    try:
        fn = getattr(importlib.import_module(f"parlab.grading.{lab}"), check)
        exercise = fn.exercise
    except (ImportError, AttributeError):
        return {"passed": False, "message": f"unknown check {lab}.{check}"}
    name, hidden = str(request["name"]), bool(request["hidden"])
    answer = Payload(Path(request["payload"]).read_bytes())
    message = grade_batch({exercise: {name: answer}}, hidden=hidden, catch=False,
                          isolate=True)[(exercise.key, name)]
    if message:
        return {"passed": False, "message": message}
    return {"passed": True, "message": summary(exercise, name, hidden)}


def grade_cell(calls: list[dict]) -> list[dict]:
    """The verdicts of one test cell's calls, stopping at the first that fails."""
    verdicts: list[dict] = []
    for call in calls:
        try:
            verdicts.append(grade_request(call))
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
    done: list[dict] = []
    for cell in request["cells"]:
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(printed):
            verdicts = grade_cell(cell["calls"])
        done.append({"key": cell["key"], "verdicts": verdicts, "printed": printed.getvalue()})
        Path(request["verdict"]).write_text(json.dumps(done))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
