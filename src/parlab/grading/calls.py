"""Which functions of a module the student's code called, for prediction exercises.

A prediction exercise asks for a formula written out; ``parlab.cost`` holds
the same formulas as the check's reference, so an answer that calls it gets
the right numbers without writing anything.  ``calls_into(module)`` records,
through ``sys.setprofile``, every Python function of that module called
inside the block, however it was imported (``from parlab.cost import ...``
bound before the check started is seen too, which a patched attribute would
miss).  ``no_cost_calls`` is the rule judged on the noted names.
"""
from __future__ import annotations

import contextlib
import sys

#: The rule's sentence, stated in labs 03-05 next to each prediction exercise.
NO_COST_SAYS = ("Write the formula yourself: no call into `parlab.cost`, which the check uses as "
                "its reference.")


@contextlib.contextmanager
def calls_into(module, names: list):
    """Append to ``names`` the name of every function of ``module`` called inside the block."""
    where = module.__file__
    previous = sys.getprofile()

    def profile(frame, event, arg):
        if (event == "call" and frame.f_code.co_filename == where
                and (frame.f_back is None or frame.f_back.f_code.co_filename != where)):
            names.append(frame.f_code.co_name)  # the call from outside, not cost's own helpers
        if previous is not None:
            previous(frame, event, arg)

    sys.setprofile(profile)
    try:
        yield names
    finally:
        sys.setprofile(previous)


def watched_cost_call(spy, fn, *args):
    """``fn(*args)`` inside ``spy.watch()``, noting the ``parlab.cost`` functions it called."""
    from .. import cost

    names: list[str] = []
    with spy.watch(), calls_into(cost, names):
        got = fn(*args)
    spy.note("cost_calls", names=list(dict.fromkeys(names)))
    return got


def no_cost_calls(records, case, n) -> str | None:
    for rec in records:
        for e in rec["events"]:
            if e["event"] == "cost_calls" and e["names"]:
                called = ", ".join(f"parlab.cost.{name}" for name in e["names"][:3])
                return (f"it called {called}: that is the check's own reference, not your formula. "
                        "Write the arithmetic out (the exercise's text gives every term).")
    return None
