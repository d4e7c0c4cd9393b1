"""Lab 00's case: one call of the student's function, shown as a student would type it.

``Call("weight_bytes", (70e9, 2)).describe(1)`` is ``weight_bytes(70e9, 2)``;
a call that runs on ranks (``hello``) adds the world size: ``hello() on 2 ranks``.
Both the harness's messages and the graders name a case this way.
"""
from __future__ import annotations

import math
from dataclasses import dataclass


def typed(x) -> str:
    """A number as a student would type it: 70e9, 7.5e9, 15e12, 2, 0.4, 123456789."""
    if isinstance(x, int) or abs(x) < 1e4:
        return str(x) if isinstance(x, int) else f"{x:g}"
    e = 3 * math.floor(math.log10(abs(x)) / 3)
    return f"{x / 10**e:g}e{e}"


@dataclass(frozen=True)
class Call:
    """One call of the student's function, shown the way a student would type it."""

    name: str
    args: tuple = ()
    on_ranks: bool = False

    def describe(self, n: int) -> str:
        call = f"{self.name}({', '.join(typed(a) for a in self.args)})"
        return f"{call} on {n} rank{'s' if n != 1 else ''}" if self.on_ranks else call
