"""Prediction exercises: the student writes a formula, the check compares the number.

A lab's "predict a number" exercise is declared with ``prediction``::

    MEMORY = prediction(
        "lab05.memory", "zero_bytes_per_rank",
        call="zero_bytes_per_rank(n_params={}, n={}, stage={})",
        want=lambda psi, n, stage: zero_memory_per_gpu(psi, n, stage),
        mistakes=memory_mistakes, unit="bytes",
        visible=((7.5e9, 64, 0), ...), hidden=((1e6, 4, 1), ...))

Each case is the tuple of arguments the answer is called with, in one
process (a formula needs no ranks); ``want``, ``mistakes`` and ``call``
take the same arguments (a case that is not a tuple is the one argument).  ``run_prediction`` calls it inside
``spy.watch()``, noting any call into ``parlab.cost`` (the check's own
reference: ``NO_COST`` is the rule against it), and returns the number as
plain data.  ``prediction_grader`` compares it with ``want(*args)`` through
``parlab.grading.numbers.numbers_message``: the first wrong case gives the
message, naming a mistake of ``mistakes(*args)`` (``(the value that mistake
gives, why[, name])``) only when it gives the answer's number on every wrong
case and no other mistake does.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence

from functools import partial

from .calls import NO_COST_SAYS, no_cost_calls, watched_cost_call
from .diagnosis import Term, which_term
from .harness import Exercise, Graded, Rule
from .numbers import numbers_message
from .plain import plain_number

__all__ = ["NO_COST", "Term", "prediction", "prediction_grader", "run_prediction", "run_varied"]

#: The rule stated next to every prediction exercise: write the formula, do not call the reference.
NO_COST = Rule(NO_COST_SAYS, no_cost_calls)


def run_prediction(fn, args: tuple, i: int, spy):
    """``fn(*args)`` watched for calls into ``parlab.cost``; its result as a plain number."""
    return plain_number(watched_cost_call(spy, fn, *_arguments(args)))


def run_varied(terms: Sequence[Term], fn, args, i: int, spy, as_plain=plain_number) -> list:
    """``[fn(*args), fn(*args with each term's input doubled), ...]`` as plain numbers (or as
    ``as_plain`` makes each result plain data), each call watched for calls into ``parlab.cost``;
    a call that raises gives None (the case's own call raises as it would alone)."""
    args = _arguments(args)
    out = [as_plain(watched_cost_call(spy, fn, *args))]
    for term in terms:
        try:
            out.append(as_plain(watched_cost_call(spy, fn, *term.vary(args))))
        except Exception:  # noqa: BLE001 - a varied input the answer cannot take says nothing
            out.append(None)
    return out


def _no_mistakes(*args) -> Sequence[tuple[float, str]]:
    return ()


def _arguments(case) -> tuple:
    return case if isinstance(case, tuple) else (case,)


def prediction_grader(call: str | Callable[..., str], want: Callable[..., float],
                      mistakes: Callable[..., Sequence[tuple[float, str]]] = _no_mistakes,
                      unit: str = "", rtol: float = 1e-6,
                      integer: bool = False, terms: Sequence[Term] = ()) -> Callable[[Graded], str | None]:
    """A grader: the message for the first case whose number is not ``want(*args)``, or None.

    ``call`` shows the call with ``{}`` for each argument
    (``"weight_bytes(n_params={}, bytes_per_param={})"``), or is a function
    of the arguments that gives that text.
    """
    def grade(g: Graded) -> str | None:
        rows, varied = [], []
        for i, case in enumerate(g.cases[:len(g.results[0])]):
            args = _arguments(case)
            shown = call(*args) if callable(call) else call.format(*args)
            got = g.results[0][i]
            if terms:
                got, others = (got[0], got[1:]) if isinstance(got, list) and len(got) == len(terms) + 1 \
                    else (got, [None] * len(terms))
                varied.append([(t, v, want(*t.vary(args))) for t, v in zip(terms, others)])
            rows.append((got, want(*args), shown, mistakes(*args)))

        def differs(got, wanted, i):
            changes = varied[i] if terms else []
            return which_term(got, wanted, changes) if all(isinstance(v, (int, float)) for _, v, _ in changes) else ""
        return numbers_message(rows, rtol=rtol, unit=unit, integer=integer, differs=differs if terms else None)
    return grade


def prediction(key: str, answer: str, *, call: str, want: Callable[..., float],
               visible: Sequence[tuple], hidden: Sequence[tuple],
               mistakes: Callable[..., Sequence[tuple[float, str]]] = _no_mistakes,
               unit: str = "", rtol: float = 1e-6, integer: bool = False,
               rules: tuple = (NO_COST,), terms: Sequence[Term] = ()) -> Exercise:
    """A prediction exercise (see the module docstring); ``visible``/``hidden``: argument tuples.
    With ``terms`` the answer is also called with each term's input doubled, to say which term is
    wrong when no known mistake explains a wrong number (``diagnosis.which_term``)."""
    return Exercise(key=key, answer=answer, run=partial(run_varied, tuple(terms)) if terms else run_prediction,
                    grade=prediction_grader(call, want, mistakes, unit, rtol, integer, terms),
                    visible=((1, tuple(visible)),), hidden=((1, tuple(hidden)),) if hidden else (),
                    rules=rules, solo=True)
