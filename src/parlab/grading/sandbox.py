"""Grade handed-in answers in a fresh process: ``python -m parlab.grading.sandbox REQUEST.json``.

Started by ``parlab.grading.autograde`` once per test cell.  The request
lists the cell's check calls in order; each names the lab, the check,
whether it is the hidden one, the answer's name and the file holding the
answer pickled by value.  Grading stops at the first call that fails.  This
process imports the checks itself (nothing from the student's kernel
reaches it), never unpickles the answer (only the ranks do), and gets back
only plain data from the ranks (``launch(..., plain_results=True)``).  It
writes a list of ``{"passed": bool, "message": str}``, one per call graded,
to the request's verdict path;
what the ranks print goes to stdout, which the preprocessor shows in the cell.
"""
from __future__ import annotations

import importlib
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


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__.splitlines()[0])
        return 2
    request = json.loads(Path(argv[0]).read_text())
    verdicts: list[dict] = []
    for call in request["calls"]:
        verdicts.append(grade_request(call))
        if verdicts[-1]["passed"]:
            print(verdicts[-1]["message"], flush=True)
        if not verdicts[-1]["passed"]:
            break
    Path(request["verdict"]).write_text(json.dumps(verdicts))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
