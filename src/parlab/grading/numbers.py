"""Grading a returned number, with a table of the mistakes that produce wrong ones.

``numbers_message(rows)`` says what is wrong with the numbers a student's
function returned on every case a check ran, or None when all are right:
the message is about the first wrong case, and it names a mistake (bits
instead of bytes, GB instead of bytes, a forgotten factor) only when the
answer equals the value that mistake gives on every wrong case, no right case
rules it out, and no other known mistake does the same
(``parlab.grading.diagnosis``).  Otherwise it says by what ratio the number
is off.  ``number_message`` is that for one case; ``assert_number`` raises
its message as an AssertionError.  A mistake is ``(value, sentence)`` or
``(value, sentence, name)``: the name (the sentence when there is none)
is what stays the same from case to case; a value of None says that the
mistake does not apply to that case (it neither fits nor is ruled out there).

``plain_number(value)`` (from ``parlab.grading.plain``, exported here too)
is what a rank sends back to the grader for any returned value: a number as
a plain ``int``/``float``, None or a bool as they are, and anything else as
``{"type": ..., "repr": ...}``; ``shown`` reads that description.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from numbers import Integral, Real

from .diagnosis import diagnose
from .plain import plain_number

__all__ = ["assert_number", "matches", "number_message", "numbers_message", "plain_number",
           "distinct", "shown"]

def matches(got: float, want: float, rtol: float = 1e-6) -> bool:
    """True when ``got`` equals ``want`` up to a relative tolerance (exact for 0)."""
    return math.isclose(got, want, rel_tol=rtol, abs_tol=0.0 if want else 1e-12)


def distinct(a: float, b: float) -> tuple[str, str]:
    """``a`` and ``b`` printed with the fewest significant digits (at least 6) that tell them apart."""
    for digits in range(6, 18):
        sa, sb = f"{a:.{digits}g}", f"{b:.{digits}g}"
        if sa != sb or a == b:
            return sa, sb
    return repr(a), repr(b)


def shown(got) -> tuple[str, str]:
    """(repr, type name) of a returned value or of ``plain_number``'s description of it."""
    if isinstance(got, dict) and set(got) == {"type", "repr"}:
        return str(got["repr"]), str(got["type"])
    return repr(got), type(got).__name__


def _one(value: float, unit: str) -> str:
    """" GPUs" -> " GPU" for exactly 1 (units like " GB/s" stay as they are)."""
    return unit[:-1] if value == 1 and unit[1:].isalpha() and unit.endswith("s") else unit


def _problem(got, want: float, call: str, unit: str, integer: bool, rtol: float) -> str | None:
    """What is wrong with ``got`` that is not a wrong value (no return, not a number, not whole)."""
    if got is None:
        return f"{call} returned None: did you forget the `return` statement?"
    if isinstance(got, bool) or not isinstance(got, Real):
        text, kind = shown(got)
        in_unit = f" (in{unit})" if unit else ""
        return f"{call} returned {text} ({kind}); it should return a number{in_unit}."
    value = float(got)
    if not math.isfinite(value):
        return (f"{call} returned {got!r}, expected {want:.6g}{unit}: a division by zero or an "
                "overflow somewhere in your formula?")
    if integer and value != int(value):
        return f"{call} returned {got!r}, but a count must be a whole number: round up with math.ceil."
    if integer and matches(value, want, rtol) and not isinstance(got, Integral):
        return f"{call} returned {got!r}; return it as an int (math.ceil gives one)."
    return None


def _named(mistakes) -> list[tuple[float, str, str]]:
    """(value, sentence, name) of each mistake that applies to the case (a value of None: it does not)."""
    return [(m[0], m[1], m[2] if len(m) > 2 else m[1]) for m in mistakes if m[0] is not None]


def numbers_message(rows: Sequence[tuple], rtol: float = 1e-6, unit: str = "",
                    integer: bool = False, differs=None) -> str | None:
    """What is wrong with the numbers of every case a check ran, or None when all are right.

    ``rows`` holds ``(got, want, call, mistakes)`` per case, in order (see
    the module docstring and ``number_message``).  The first case whose
    number is not a number, or is wrong, gives the message; a mistake is
    named only from the evidence of every case.  Without one, the message says
    what differs: ``differs(got, want, case index)`` when given and not "",
    else the ratio.
    """
    unit = f" {unit}" if unit else ""
    first = None
    wrong: list[dict] = []
    right: list[list[str]] = []
    for got, want, call, mistakes in rows:
        problem = _problem(got, want, call, unit, integer, rtol)
        if problem:
            return problem
        value, table = float(got), _named(mistakes)
        if matches(value, want, rtol):
            right.append([name for v, _, name in table if not matches(v, want, rtol)])
            continue
        wrong.append({name: why for v, why, name in table if matches(value, v, rtol)})
        if first is None:
            first = (value, want, call, len(right) + len(wrong) - 1)
    if first is None:
        return None
    value, want, call, at = first
    shown_got, shown_want = distinct(value, want)
    message = f"{call} returned {shown_got}{_one(value, unit)}, expected {shown_want}{_one(want, unit)}."
    named = diagnose(wrong, right)
    if named:
        return f"{message} {named}"
    said = differs(value, want, at) if differs else ""
    if said:
        return f"{message} {said}"
    if want:
        ratio = f"{value / want:.4g}"
        if ratio == "1":  # close to right: show enough digits to see that it is not 1
            ratio = distinct(value / want, 1.0)[0]
        message += f" (Yours is {ratio} times the expected value.)"
    return message


def number_message(got, want: float, call: str, mistakes: Sequence[tuple] = (),
                   rtol: float = 1e-6, unit: str = "", integer: bool = False) -> str | None:
    """What is wrong with ``got`` as the answer ``want``, or None when it is right.

    ``call`` is how the student's call reads (``"weight_bytes(70e9, 2)"``);
    ``mistakes`` pairs the value a typical mistake would give with a sentence
    that names it (named only when exactly one mistake gives ``got``).  With
    ``integer=True`` the answer must be a whole ``int``.
    """
    return numbers_message([(got, want, call, mistakes)], rtol, unit, integer)


def assert_number(got, want: float, call: str, mistakes: Sequence[tuple[float, str]] = (),
                  rtol: float = 1e-6, unit: str = "", integer: bool = False) -> None:
    """Raise AssertionError with ``number_message``'s text unless ``got`` is right."""
    message = number_message(got, want, call, mistakes, rtol, unit, integer)
    if message:
        raise AssertionError(message)
