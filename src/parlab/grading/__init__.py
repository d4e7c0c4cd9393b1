"""Checks that the labs' autograded test cells call, one module per lab.

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

This module holds the one helper every numeric check shares:
``assert_number`` compares a returned number with the expected one and, when
the answer matches a known wrong answer (bits instead of bytes, GB instead
of bytes, a forgotten factor), says which mistake it was.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from numbers import Real

__all__ = ["assert_number", "matches"]


def matches(got: float, want: float, rtol: float = 1e-6) -> bool:
    """True when ``got`` equals ``want`` up to a relative tolerance (exact for 0)."""
    return math.isclose(got, want, rel_tol=rtol, abs_tol=0.0 if want else 1e-12)


def assert_number(got, want: float, call: str, mistakes: Sequence[tuple[float, str]] = (),
                  rtol: float = 1e-6, unit: str = "", integer: bool = False) -> None:
    """Raise AssertionError unless ``got`` is a number within ``rtol`` of ``want``.

    ``call`` is how the student's call reads (``"weight_bytes(70e9, 2)"``);
    ``mistakes`` pairs the value a typical mistake would give with a sentence
    that names it.  With ``integer=True`` the answer must be a whole ``int``.
    """
    unit = f" {unit}" if unit else ""
    if got is None:
        raise AssertionError(f"{call} returned None: did you forget the `return` statement?")
    if isinstance(got, bool) or not isinstance(got, Real):
        raise AssertionError(f"{call} returned {got!r} ({type(got).__name__}); "
                             f"it should return a number{unit}.")
    if integer and int(got) != got:
        raise AssertionError(f"{call} returned {got!r}, but a count must be a whole number: "
                             "round up with math.ceil.")
    if matches(float(got), want, rtol):
        if integer and not isinstance(got, int):
            raise AssertionError(f"{call} returned {got!r}; return it as an int (math.ceil gives one).")
        return
    hint = next((why for value, why in mistakes if matches(float(got), value, rtol)), None)
    message = f"{call} returned {float(got):.6g}{unit}, expected {want:.6g}{unit}."
    if hint:
        message += " " + hint
    elif want:
        message += f" (Yours is {float(got) / want:.4g} times the expected value.)"
    raise AssertionError(message)
