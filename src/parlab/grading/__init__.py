"""Checks that the labs' autograded test cells call, one package per lab.

A lab's test cell looks like this::

    from parlab.grading import lab00
    lab00.check_weight_bytes(weight_bytes)               # visible: students can run it
    ### BEGIN HIDDEN TESTS
    lab00.check_weight_bytes(weight_bytes, hidden=True)  # other inputs, graded only
    ### END HIDDEN TESTS

Every ``check_<exercise>(student_fn, hidden=False)`` compares the student's
function with a reference that does not give the exercise away (a
``parlab.cost`` formula, a torch built-in, a single-process computation) and
raises ``AssertionError`` with a message in the student's terms.  nbgrader
marks a test cell that raises as failed.

``diagnosis`` is the one rule every lab's hints follow: a hint names a
mistake only when the answer's results fit that mistake's signature on every
case, rank and step the check ran and no other known mistake's; otherwise the
message says what differs.  ``numbers`` holds what every numeric check
shares: ``numbers_message`` compares the returned numbers with the expected
ones and names a known wrong answer (bits instead of bytes, GB instead of
bytes, a forgotten factor) by that rule; ``assert_number`` is re-exported here.
``harness`` declares exercises and grades them; ``spy`` records how an
answer did its work and ``records`` reads that record; ``plain`` turns what
leaves a rank into plain data; ``predictions`` declares the "predict a
number" exercises.  ``autograde`` runs the answers while nbgrader grades a
submission (``execute``, ``sandbox`` and ``shared_launches``: one launch per
world size shared across a notebook's answers).  Grading a whole class
(workers, the Slurm array, the merge) is not a check: it is ``parlab.classgrade``.

Each lab's checks live together in ``labNN/``: ``__init__`` declares the
exercises and the ``check_*`` functions the notebook calls, and the lab's
other modules (``cases``, ``graders``, ``rules``, ...) hold its cases and
references, the comparisons, and the rules judged on the spy's records.
"""
from __future__ import annotations

from .numbers import assert_number, matches

__all__ = ["assert_number", "matches"]
