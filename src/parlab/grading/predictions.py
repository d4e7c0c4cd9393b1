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
``parlab.grading.numbers.number_message``: the first wrong case gives the
message, naming the mistake when the number equals one of
``mistakes(*args)``, pairs ``(the value that mistake gives, why)``.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence

from .calls import NO_COST_SAYS, no_cost_calls, watched_cost_call
from .harness import Exercise, Graded, Rule
from .numbers import number_message
from .plain import plain_number

__all__ = ["NO_COST", "prediction", "prediction_grader", "run_prediction"]

#: The rule stated next to every prediction exercise: write the formula, do not call the reference.
NO_COST = Rule(NO_COST_SAYS, no_cost_calls)


def run_prediction(fn, args: tuple, i: int, spy):
    """``fn(*args)`` watched for calls into ``parlab.cost``; its result as a plain number."""
    return plain_number(watched_cost_call(spy, fn, *args))


def _no_mistakes(*args) -> Sequence[tuple[float, str]]:
    return ()


def _arguments(case) -> tuple:
    return case if isinstance(case, tuple) else (case,)


def prediction_grader(call: str | Callable[..., str], want: Callable[..., float],
                      mistakes: Callable[..., Sequence[tuple[float, str]]] = _no_mistakes,
                      unit: str = "", rtol: float = 1e-6,
                      integer: bool = False) -> Callable[[Graded], str | None]:
    """A grader: the message for the first case whose number is not ``want(*args)``, or None.

    ``call`` shows the call with ``{}`` for each argument
    (``"weight_bytes(n_params={}, bytes_per_param={})"``), or is a function
    of the arguments that gives that text.
    """
    def grade(g: Graded) -> str | None:
        for i, case in enumerate(g.cases[:len(g.results[0])]):
            args = _arguments(case)
            shown = call(*args) if callable(call) else call.format(*args)
            message = number_message(g.results[0][i], want(*args), shown,
                                     mistakes(*args), rtol=rtol, unit=unit, integer=integer)
            if message:
                return message
        return None
    return grade


def prediction(key: str, answer: str, *, call: str, want: Callable[..., float],
               visible: Sequence[tuple], hidden: Sequence[tuple],
               mistakes: Callable[..., Sequence[tuple[float, str]]] = _no_mistakes,
               unit: str = "", rtol: float = 1e-6, integer: bool = False,
               rules: tuple = (NO_COST,)) -> Exercise:
    """A prediction exercise (see the module docstring); ``visible``/``hidden``: argument tuples."""
    return Exercise(key=key, answer=answer, run=run_prediction,
                    grade=prediction_grader(call, want, mistakes, unit, rtol, integer),
                    visible=((1, tuple(visible)),), hidden=((1, tuple(hidden)),) if hidden else (),
                    rules=rules, solo=True)
