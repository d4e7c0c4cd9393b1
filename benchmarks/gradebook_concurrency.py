"""Is nbgrader's SQLite gradebook safe for concurrent writers?  Two races, measured.

nbgrader's FAQ says sqlite "is not threadsafe" and that nbgrader does not
support parallel autograding (nbgrader docs, user_guide/faq.rst, "Does
nbgrader support parallel autograding of assignments?" and "Do I have to
use sqlite for the nbgrader database?").  This script shows what that means
for ``parlab grade`` with the real ``nbgrader.api.Gradebook``:

1. **fresh database**: W processes open ``Gradebook`` on one new file at the
   same moment, as W parallel ``nbgrader autograde`` runs on a new course
   would; each creates the tables and the course row.
2. **held lock**: one process holds a write transaction for HOLD seconds
   (a long commit, a backup, the formgrader); W processes meanwhile each
   record a student, as autograde does first.

It prints how many of the W writers failed and with which error.  Any
failure means concurrent autogrades lose work, so ``parlab grade`` grades
each submission into a gradebook of its own and one writer merges.

    python benchmarks/gradebook_concurrency.py [--writers 16] [--hold 7]
"""
import argparse
import multiprocessing as mp
import sqlite3
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path


def _open_and_add(url: str, student: str, start: float, out) -> None:
    import logging

    from nbgrader.api import Gradebook
    logging.disable(logging.CRITICAL)  # nbgrader logs each failure's traceback; the count is the result
    while time.time() < start:  # every writer starts at the same moment
        time.sleep(0.001)
    try:
        with Gradebook(url, "parlab") as gb:
            gb.update_or_create_student(student)
        out.put("ok")
    except Exception as exc:  # noqa: BLE001 - what fails is the measurement
        out.put(f"{type(exc).__name__}: {str(exc).splitlines()[0][:90]}")


def _hold(path: str, seconds: float, ready) -> None:
    con = sqlite3.connect(path, isolation_level=None)
    con.execute("BEGIN IMMEDIATE")  # a write lock, as a long transaction holds it
    con.execute("INSERT INTO student (id) VALUES ('holder')")
    ready.set()
    time.sleep(seconds)
    con.execute("COMMIT")


def _race(url: str, writers: int) -> Counter:
    out = mp.Queue()
    start = time.time() + 1.0
    procs = [mp.Process(target=_open_and_add, args=(url, f"s{i}", start, out)) for i in range(writers)]
    for p in procs:
        p.start()
    results = Counter(out.get() for _ in procs)
    for p in procs:
        p.join()
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--writers", type=int, default=16)
    parser.add_argument("--hold", type=float, default=7.0)
    args = parser.parse_args()
    bad = 0
    with tempfile.TemporaryDirectory() as tmp:
        fresh = Path(tmp) / "fresh.db"
        got = _race(f"sqlite:///{fresh}", args.writers)
        bad += args.writers - got["ok"]
        print(f"1. fresh database, {args.writers} writers at once: {dict(got)}")
        held = Path(tmp) / "held.db"
        from nbgrader.api import Gradebook
        with Gradebook(f"sqlite:///{held}", "parlab"):
            pass
        ready = mp.Event()
        holder = mp.Process(target=_hold, args=(str(held), args.hold, ready))
        holder.start()
        ready.wait()
        got = _race(f"sqlite:///{held}", args.writers)
        holder.join()
        bad += args.writers - got["ok"]
        print(f"2. write lock held {args.hold:g} s, {args.writers} writers: {dict(got)}")
    print("concurrent writers lost work" if bad else "no writer failed in this run")
    return 0


if __name__ == "__main__":
    sys.exit(main())
