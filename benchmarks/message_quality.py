"""Whether the checks' failure messages name the student's mistake, per lab, over the suite's own wrong answers.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/message_quality.py [--labs 00 03] [--json out.json]

Every wrong answer of ``tests/wrong_answers/labNN.py`` (``WRONG`` on the
visible cases, ``WRONG_HIDDEN`` on the hidden ones: what the answer suite
grades, in the same batches; ``ALONE`` answers, graded one launch each, are
left out) is graded, and its message is sorted by the row's words
(``wrong_answers.Says``):

- **names the mistake**: it holds the words that name the answer's mistake;
- **says what differs**: the answer's results fit two known mistakes on every
  case, so the row asks for what differs and no cause (``Says.differs``),
  and the message says it;
- **generic**: it lacks the row's words (no term, state, call or cause);
- **names another**: it holds words the row forbids (another mistake's hint);
- **passed**: the check did not catch it.

The row's words are the standard; they are the same for a run of an older
grader, which is how a before/after comparison is made: run this script
with ``PYTHONPATH`` pointing at an older ``src`` (``git archive <commit> src
| tar -x -C /tmp/old``; ``PYTHONPATH=/tmp/old/src``) against the same
``tests/``.  The ``parlab`` it graded with is printed first.
"""
from __future__ import annotations

import argparse
import importlib
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "tests" / "ranks"), str(ROOT / "tests" / "unit")]

import parlab  # noqa: E402
from parlab.grading import harness  # noqa: E402
from wrong_answers import Says, must, must_not  # noqa: E402

#: lab -> the test module whose ``TestAnswers`` names its exercises and answers.
SUITES = {"00": "test_lab00", "01": "test_lab01", "02": "test_lab02", "03": "test_lab03",
          "04": "test_lab04", "05": "test_lab05", "06": "test_lab06", "06p": "test_lab06_planner",
          "07": "test_lab07", "08": "test_lab08"}
KINDS = ("names", "differs", "generic", "other", "passed")


def kind(message: str | None, words) -> str:
    """Which of ``KINDS`` a wrong answer's message is, by its row's words."""
    if message is None:
        return "passed"
    if any(w in message for w in must_not(words)):
        return "other"
    if not all(w in message for w in must(words)):
        return "generic"
    return "differs" if isinstance(words, Says) and words.differs else "names"


def lab_rows(suite) -> list[dict]:
    """Every WRONG and WRONG_HIDDEN row of one lab, graded as the answer suite grades it."""
    out = []
    for table, hidden in (("WRONG", False), ("WRONG_HIDDEN", True)):
        rows = suite.table(table)
        batch: dict = {}
        for key, pairs in rows.items():
            batch.setdefault(suite.exercises[key], {}).update({a.__name__: a for a, _ in pairs})
        if not batch:
            continue
        report = harness.grade_batch(batch, hidden=hidden, timeout=suite.batch_timeout)
        for key, pairs in rows.items():
            ex = suite.exercises[key]
            for answer, words in pairs:
                message = report[(ex.key, answer.__name__)]
                out.append({"key": key, "answer": answer.__name__, "table": table,
                            "kind": kind(message, words), "message": message})
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--labs", nargs="*", default=list(SUITES), choices=list(SUITES))
    parser.add_argument("--json", help="write every row and its message here")
    args = parser.parse_args()
    print(f"parlab from {Path(parlab.__file__).parent}")
    print(f"{'lab':>4} " + " ".join(f"{k:>8}" for k in KINDS) + "   total")
    every, totals = [], dict.fromkeys(KINDS, 0)
    for lab in args.labs:
        suite = importlib.import_module(SUITES[lab]).TestAnswers()
        rows = lab_rows(suite)
        counts = {k: sum(r["kind"] == k for r in rows) for k in KINDS}
        for k in KINDS:
            totals[k] += counts[k]
        print(f"{lab:>4} " + " ".join(f"{counts[k]:>8}" for k in KINDS) + f"   {len(rows)}", flush=True)
        every += [{"lab": lab, **r} for r in rows]
    print(f"{'all':>4} " + " ".join(f"{totals[k]:>8}" for k in KINDS) + f"   {len(every)}")
    if args.json:
        Path(args.json).write_text(json.dumps(every, indent=1))


if __name__ == "__main__":
    main()
