"""What ``parlab grade`` prints: a line per change of state with a bar, then the summary.

Each submission is queued, grading, done (with its score), failed (the
grader could not grade it: never a 0, graded again on the next run),
rejected (bad input, with the reason) or skipped (graded before and
unchanged).  The summary has one row per graded student with the score of
each graded cell, then the submissions that were not graded and why,
grader failures apart from bad input.
"""
from __future__ import annotations

import sys
import time

BAR = 24


class Progress:
    def __init__(self, lab: str, students: list[str], out=None):
        self.lab, self.out, self.start = lab, out or sys.stdout, time.monotonic()
        self.state = {s: "queued" for s in students}
        self.scores: dict[str, dict[str, tuple[float, float]]] = {}
        self.failed: dict[str, str] = {}     # the grader's fault
        self.rejected: dict[str, str] = {}   # bad input
        self.skipped: list[str] = []
        self.absent: list[str] = []

    def _bar(self) -> str:
        n = len(self.state) or 1
        count = {k: sum(v == k for v in self.state.values())
                 for k in ("done", "failed", "grading", "queued")}
        filled = round(BAR * (count["done"] + count["failed"]) / n)
        return (f"[{'#' * filled}{'.' * (BAR - filled)}] {count['done']} done, {count['failed']} failed, "
                f"{count['grading']} grading, {count['queued']} queued")

    def set(self, student: str, state: str, detail: str = "") -> None:
        self.state[student] = state
        t = time.monotonic() - self.start
        print(f"{t:7.1f} s  {student:<16} {state:<8} {detail}".rstrip() + f"   {self._bar()}",
              file=self.out, flush=True)

    def note(self, text: str) -> None:
        """A line about the run rather than one submission (a Slurm task's state)."""
        print(f"{time.monotonic() - self.start:7.1f} s  {text}", file=self.out, flush=True)

    def done(self, student: str, scores: dict[str, tuple[float, float]], seconds: float) -> None:
        self.scores[student] = scores
        got, most = sum(s for s, _ in scores.values()), sum(m for _, m in scores.values())
        self.set(student, "done", f"{got:g}/{most:g} in {seconds:.0f} s")

    def fail(self, student: str, why: str) -> None:
        self.failed[student] = why
        self.set(student, "failed", why.splitlines()[0][:100] if why else "")

    def summary(self) -> str:
        lines = [f"\n{self.lab}: {len(self.scores)} graded, {len(self.skipped)} unchanged since their "
                 f"last grade, {len(self.failed)} failed to grade, {len(self.rejected)} rejected, "
                 f"{len(self.absent)} not submitted ({time.monotonic() - self.start:.0f} s)"]
        cells = sorted({c for s in self.scores.values() for c in s})
        if cells:
            width = [max(len(c), 5) for c in cells]
            lines.append("\n" + "student".ljust(16) + " ".join(c.rjust(w) for c, w in zip(cells, width))
                         + "  total")
            for student in sorted(self.scores):
                s = self.scores[student]
                row = " ".join((f"{s[c][0]:g}/{s[c][1]:g}" if c in s else "-").rjust(w)
                               for c, w in zip(cells, width))
                total = f"{sum(v[0] for v in s.values()):g}/{sum(v[1] for v in s.values()):g}"
                lines.append(f"{student:<16}{row}  {total}")
        for title, table in (("failed to grade (the grader's fault: no score given; run again to "
                              "regrade them)", self.failed),
                             ("rejected (bad input: fix it and run again)", self.rejected)):
            if table:
                lines.append(f"\n{title}:")
                lines += [f"  {student}: {why}" for student, why in sorted(table.items())]
        if self.skipped:
            lines.append(f"\nunchanged since their last grade: {', '.join(sorted(self.skipped))}")
        if self.absent:
            lines.append(f"\nno submission from: {', '.join(self.absent)}")
        return "\n".join(lines)
