"""Compare two verdict logs written with PARLAB_VERDICT_LOG (tests/conftest.py).

    PARLAB_VERDICT_LOG=/tmp/before.jsonl make test     # before a change to the checks
    PARLAB_VERDICT_LOG=/tmp/after.jsonl make test      # after it
    python scripts/verdicts_diff.py /tmp/before.jsonl /tmp/after.jsonl [--only lab03]

A verdict is keyed by its test (the module's file name, so that moving a test
module between folders changes nothing), its exercise, visible or hidden, and
its place among that test's verdicts for the same key.  With ``--by-answer`` the
test is left out and the answer's name put in: for a change that moves verdicts
between the tests of a module (one batch fixture shared by new tests).  Prints every verdict
that changed (passed where it failed, or the reverse), every message that
changed, and what either log has that the other lacks; exits 1 when a verdict
changed or a key is missing from either side, 0 when only messages differ or
nothing does.  A traceback's frames name files by their path in the checkout
and by line: both are masked (``File "<checkout>/src/parlab/...", line N``), so
that two checkouts, or code moved within a file, compare equal.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import re
import sys

FRAME = re.compile(r'File "[^"]*?/((?:src|tests|\.venv)/[^"]*)", line \d+')


def masked(message: str | None) -> str | None:
    return None if message is None else FRAME.sub(r'File "<checkout>/\1", line N', message)


def load(path: str, only: str | None, by_answer: bool = False) -> dict[tuple, str | None]:
    seen: collections.Counter = collections.Counter()
    out = {}
    with open(path) as f:
        for line in f:
            v = json.loads(line)
            module, _, test = v["test"].partition("::")
            key = (os.path.basename(module), v["answer"] if by_answer else test, v["exercise"], bool(v["hidden"]))
            if only and only not in v["exercise"] and only not in module:
                continue
            seen[key] += 1
            out[key + (seen[key],)] = masked(v["message"])
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("before")
    ap.add_argument("after")
    ap.add_argument("--only", help="keep verdicts whose exercise or module contains this (e.g. lab03)")
    ap.add_argument("--by-answer", action="store_true", help="key by the answer's name, not by the test")
    args = ap.parse_args(argv)
    before, after = (load(path, args.only, args.by_answer) for path in (args.before, args.after))
    flipped = [k for k in before.keys() & after.keys() if (before[k] is None) != (after[k] is None)]
    reworded = [k for k in before.keys() & after.keys()
                if k not in flipped and before[k] != after[k]]
    gone, new = sorted(before.keys() - after.keys()), sorted(after.keys() - before.keys())

    def show(k):
        return f"{k[0]}::{k[1]} {k[2]} {'hidden' if k[3] else 'visible'} #{k[4]}"

    for k in sorted(flipped):
        print(f"VERDICT {show(k)}: {before[k]!r} -> {after[k]!r}")
    for k in sorted(reworded):
        print(f"MESSAGE {show(k)}:\n   before: {before[k]}\n   after:  {after[k]}")
    for k in gone:
        print(f"ONLY BEFORE {show(k)}")
    for k in new:
        print(f"ONLY AFTER {show(k)}")
    common = len(before.keys() & after.keys())
    print(f"{common} verdicts in both: {len(flipped)} changed, {len(reworded)} messages changed, "
          f"{common - len(flipped) - len(reworded)} identical; {len(gone)} only before, {len(new)} only after")
    return 1 if flipped or gone or new else 0


if __name__ == "__main__":
    sys.exit(main())
