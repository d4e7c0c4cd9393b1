"""Grading a returned number, with a table of the mistakes that produce wrong ones.

``number_message(got, want, call, mistakes)`` says what is wrong with a
number a student's function returned, or None when it is right.  When the
wrong value equals what a known mistake gives (bits instead of bytes, GB
instead of bytes, a forgotten factor), the message names that mistake.
``assert_number`` raises that message as an AssertionError.

``plain_number(value)`` (from ``parlab.grading.plain``, exported here too)
is what a rank sends back to the grader for any returned value: a number as
a plain ``int``/``float``, None or a bool as they are, and anything else as
``{"type": ..., "repr": ...}``; ``shown`` reads that description.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from numbers import Integral, Real

from .plain import plain_number

__all__ = ["assert_number", "matches", "number_message", "plain_number", "distinct", "shown"]

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


def number_message(got, want: float, call: str, mistakes: Sequence[tuple[float, str]] = (),
                   rtol: float = 1e-6, unit: str = "", integer: bool = False) -> str | None:
    """What is wrong with ``got`` as the answer ``want``, or None when it is right.

    ``call`` is how the student's call reads (``"weight_bytes(70e9, 2)"``);
    ``mistakes`` pairs the value a typical mistake would give with a sentence
    that names it.  With ``integer=True`` the answer must be a whole ``int``.
    """
    unit = f" {unit}" if unit else ""
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
    if matches(value, want, rtol):
        if integer and not isinstance(got, Integral):
            return f"{call} returned {got!r}; return it as an int (math.ceil gives one)."
        return None
    hint = next((why for mistake, why in mistakes if matches(value, mistake, rtol)), None)
    shown_got, shown_want = distinct(value, want)
    message = (f"{call} returned {shown_got}{_one(value, unit)}, "
               f"expected {shown_want}{_one(want, unit)}.")
    if hint:
        message += " " + hint
    elif want:
        ratio = f"{value / want:.4g}"
        if ratio == "1":  # close to right: show enough digits to see that it is not 1
            ratio = distinct(value / want, 1.0)[0]
        message += f" (Yours is {ratio} times the expected value.)"
    return message


def assert_number(got, want: float, call: str, mistakes: Sequence[tuple[float, str]] = (),
                  rtol: float = 1e-6, unit: str = "", integer: bool = False) -> None:
    """Raise AssertionError with ``number_message``'s text unless ``got`` is right."""
    message = number_message(got, want, call, mistakes, rtol, unit, integer)
    if message:
        raise AssertionError(message)
