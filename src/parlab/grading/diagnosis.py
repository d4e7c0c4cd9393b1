"""The one rule every lab's hints follow: a hint names a mistake only when the evidence shows it.

A check runs an answer on several cases, ranks, steps or micro-batches: each
is a *piece of evidence*.  A known mistake has a *signature*, what its
results would look like on a piece (a number it gives, a scale of the
gradients, which rows a rank took).  ``diagnose`` names a mistake only when
its signature fits every wrong piece the check ran, no piece the answer got
right rules it out, and no other known mistake's signature fits every wrong
piece as well.  Otherwise it returns "" and the caller's message says only
what differs (which tensor, rank, step or case; by what ratio or at which
indices) and names no cause: a student told about a mistake they did not
make loses an hour and learns something false.

A lab's grader builds the pieces, ``{mistake name: sentence}`` for the
mistakes whose signature fits (the sentence may name the case's numbers; the
first piece's is used), and calls ``diagnose``; ``hint`` formats the result
the way the labs' messages end.  ``scale_fits`` is the signature shared by
every "the values are k times the reference" mistake (summed instead of
averaged, divided twice): a factor alone is weak evidence, so two mistakes
that give the same factor on a piece (m = p, N = m) both fit it and neither
is named.

A formula exercise says which term is wrong with ``which_term``: the answer
is also called with one input doubled at a time (``Term``), and the change
of its value is compared with the reference's.  An input whose change is
wrong points at the term that depends on it ("your answer does not grow with
the sequence length: the activations are missing"); where several inputs'
changes are wrong, the factor each input scales the answer by is compared the
same way (a product of factors), and a wrong factor of one input, or of none
(a constant), is named; otherwise "no single term explains it".
"""
from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

__all__ = ["diagnose", "hint", "scale_fits", "ratio_words", "Term", "which_term"]


def diagnose(wrong: Iterable[Mapping[str, str]], right: Iterable[Iterable[str]] = ()) -> str:
    """The sentence of the one known mistake that explains all the evidence, or "".

    ``wrong`` holds one mapping per piece the answer got wrong: the mistakes
    whose signature fits that piece, ``{name: sentence}``.  ``right`` holds,
    for each piece the answer got right, the names of mistakes that would
    have got it wrong (their signature rules them out).  A mistake is named
    when it fits every wrong piece, is ruled out by no right one, and is the
    only such mistake.
    """
    pieces = [dict(p) for p in wrong]
    if not pieces:
        return ""
    common = set(pieces[0]).intersection(*pieces[1:])
    for ruled_out in right:
        common -= set(ruled_out)
    if len(common) != 1:
        return ""
    return pieces[0][common.pop()]


def hint(sentence: str, lead: str = "\nHint: ") -> str:
    """``sentence`` as the end of a message (``lead`` + sentence), or "" when there is none."""
    return f"{lead}{sentence}" if sentence else ""


def scale_fits(scale: float | None, factors: Iterable[tuple[str, float, str]],
               rtol: float = 1e-3) -> dict[str, str]:
    """``{name: sentence}`` of the ``(name, factor, sentence)`` whose factor equals ``scale``."""
    if not scale:
        return {}
    return {name: sentence for name, factor, sentence in factors
            if factor and abs(scale / factor - 1) < rtol}


def ratio_words(scale: float) -> str:
    """A scale as a message reads it: "4x", "1/4 of", "0.731x"."""
    if scale >= 1:
        return f"{round(scale)}x" if abs(scale - round(scale)) < 1e-3 * scale else f"{scale:.4g}x"
    inv = 1 / scale if scale else 0
    if inv and abs(inv - round(inv)) < 1e-3 * inv:
        return f"1/{round(inv)} of"
    return f"{scale:.4g}x"


@dataclass(frozen=True)
class Term:
    """An input a formula exercise doubles to isolate the term that depends on it.

    ``name`` is the input as the student knows it ("seq"); ``term`` what depends on it, for a
    message ("the activations"); the input is argument ``index`` of the call, or its field
    ``field`` when given (a dataclass argument, doubled with ``dataclasses.replace``; a dotted
    ``"model.seq"`` reaches a field of a field).
    """

    name: str
    term: str
    index: int
    field: str = ""

    def vary(self, args: tuple) -> tuple:
        """``args`` with this input doubled."""
        return args[:self.index] + (_doubled(args[self.index], self.field),) + args[self.index + 1:]


def _doubled(value, field: str):
    """``value`` doubled, or its (dotted) ``field`` doubled in a copy of it."""
    if not field:
        return 2 * value
    head, _, rest = field.partition(".")
    return replace(value, **{head: _doubled(getattr(value, head), rest)})


def _same(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-9 * max(abs(a), abs(b), 1.0))


def _short(x: float) -> str:
    return f"{x:.6g}"


def which_term(got: float, want: float, changes: Sequence[tuple[Term, float, float]]) -> str:
    """Which term of a formula is wrong, from how the answer changes when each input doubles.

    ``changes`` holds ``(term, the answer with its input doubled, the reference's)``; the answer
    and reference at the case itself are ``got`` and ``want``.  "" when nothing can be said.
    """
    wrong = []
    for term, got2, want2 in changes:
        if not all(isinstance(v, (int, float)) and math.isfinite(v) for v in (got2, want2)):
            return ""
        if not _same(got2 - got, want2 - want):
            wrong.append((term, got2 - got, want2 - want))
    names = ", ".join(t.name for t, _, _ in changes)
    if not changes:
        return ""
    if not wrong:
        return (f"Doubling each of {names} changes your answer exactly as it should, so the part that "
                f"none of them changes is off, by {_short(got - want)}.")
    if len(wrong) == 1:
        term, dg, dw = wrong[0]
        if _same(dg, 0.0):
            return (f"Your answer does not change when {term.name} doubles; it should change by "
                    f"{_short(dw)}: what your answer is missing is {term.term}.")
        return (f"When {term.name} doubles, your answer changes by {_short(dg)}, not {_short(dw)}: "
                f"the term that is wrong is {term.term}; the terms that do not depend on {term.name} "
                "are right.")
    if got and want:  # a product of factors: compare how much each input scales the answer
        scaled = [(term, got2 / got, want2 / want) for term, got2, want2 in changes
                  if not _same(got2 / got, want2 / want)]
        if not scaled:
            return (f"Doubling any of {names} scales your answer as it should: a constant factor is off "
                    f"(yours is {got / want:.4g} times the expected value).")
        if len(scaled) == 1:
            term, mine, theirs = scaled[0]
            return (f"When {term.name} doubles, your answer grows {mine:.4g} times, not {theirs:.4g} times: "
                    f"the factor that is wrong is {term.term}; the other inputs scale it as they should.")
        if len({t.term for t, _, _ in scaled}) == 1 < len({t.term for t, _, _ in wrong}):
            wrong = scaled  # one factor explains what the changes, read additively, do not
    inputs = " and ".join(t.name for t, _, _ in wrong)
    if len({t.term for t, _, _ in wrong}) == 1:  # the inputs whose change is wrong all reach one term
        term = wrong[0][0].term
        return (f"Doubling {inputs} changes your answer by the wrong amounts, and only {term} depend on "
                f"{'both' if len(wrong) == 2 else 'all of them'}: the term that is wrong is {term}; the "
                "other terms are right.")
    return f"Doubling {inputs} changes your answer by the wrong amounts: no single term explains it."
